// Peer authentication: a job's secret handed out through its Store, and the challenge-response
// that every data-plane connection (the tcp transport, its healing reconnects, RPC) opens with,
// so that a process that can reach a rank's port but does not know the secret cannot join.
//
// Contract
// - sharedKey(store, key): the first caller draws kKeyBytes random bytes (getrandom)
//   and stores them under `key` with compareSet; every caller (the first included) returns the
//   value that won. Anyone who can read the store can read the key: with LOOM_STORE_TOKEN only
//   holders of the token (docs/store.md); with a FileStore, whoever can read the file; without
//   either, anyone who can reach the store's port. The key is only as secret as the store.
// - The handshake, both directions, each side proving it knows the key over a fresh nonce from
//   the other side:
//     dialer   -> acceptor: opening   (fixed size per protocol; holds the dialer's nonce)
//     acceptor -> dialer:   Challenge {acceptor's nonce, MAC(key, label, "accept", opening, nonce)}
//     dialer   -> acceptor: Proof     {MAC(key, label, "dial", opening, nonce)}
//   MAC is HMAC-SHA256 (OpenSSL's libcrypto); MACs are compared in constant time. The label
//   names the protocol (a MAC of one protocol is no use in another), the role word stops a
//   reflected MAC, the opening binds the ranks, lane and stream position, the nonces make
//   every MAC single-use. Nothing after the handshake is authenticated or encrypted: this
//   keeps strangers out; it does not stop an attacker on the path who can inject into or take
//   over an established TCP stream (that takes TLS or IPsec).
// - dial() runs the dialer's side, blocking within a deadline. Inbound runs the acceptor's side
//   without blocking, for poll loops that handshake many connections at once (a stranger that
//   connects and says nothing holds only its own entry until its deadline).
// - Thread-safety: free functions are thread-safe; an Inbound belongs to one thread.
#pragma once

#include <poll.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"

namespace loom {
class Store;
}

namespace loom::auth {

constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;
using Key = std::array<uint8_t, kKeyBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// The group's secret under `storeKey` (see above). Throws what the store throws (its own
// timeout), IoError when the stored value is not a key.
Key sharedKey(Store& store, const std::string& storeKey);

// kNonceBytes from getrandom.
Nonce randomNonce();

// HMAC-SHA256(key, part0 || part1 || ...).
Mac hmac(const Key& key, std::initializer_list<std::span<const uint8_t>> parts);
// Constant-time equality (CRYPTO_memcmp).
bool macEquals(const Mac& a, const Mac& b);

struct Challenge {
  Nonce nonce;
  Mac mac;
};
struct Proof {
  Mac mac;
};
static_assert(sizeof(Challenge) == kNonceBytes + kMacBytes && sizeof(Proof) == kMacBytes);

// The MACs of the handshake (see above); `accept` picks the acceptor's role word.
Mac handshakeMac(const Key& key, std::string_view label, bool accept,
                 std::span<const uint8_t> opening, const Nonce& acceptorNonce);

// The other side of a handshake does not hold the key (its MAC is wrong).
class AuthenticationError : public IoError {
 public:
  using IoError::IoError;
};

// The dialer's side on a connected blocking socket: writes `opening`, reads the Challenge,
// checks the acceptor's MAC, writes the Proof. Throws AuthenticationError naming `what` when the
// acceptor's MAC is wrong (it does not hold this job's key), IoError when the connection fails,
// TimeoutError when the deadline passes.
void dial(int fd, const Key& key, std::string_view label, std::span<const uint8_t> opening,
          const Deadline& deadline, const std::string& what);

// The acceptor's side of one connection, driven by a poll loop: call advance() when poll says
// its fd is readable (or its deadline passed).
class Inbound {
 public:
  // Checks a complete opening before the challenge is sent: "" to go on, else why not (the
  // connection fails with that reason).
  using Check = std::function<std::string(std::span<const uint8_t> opening)>;

  enum class State { kPending, kDone, kFailed };

  Inbound(net::Socket sock, size_t openingBytes, Clock::time_point deadline);

  int fd() const { return sock_.fd(); }
  const std::string& address() const { return address_; }
  Clock::time_point deadline() const { return deadline_; }
  // Reads what the socket holds (never more than the handshake's bytes, so the data that
  // follows stays in the socket), answers the opening with the Challenge, checks the Proof.
  // kFailed: why() says why (a timeout, a closed connection, a check or a wrong MAC).
  State advance(const Key& key, std::string_view label, const Check& check);
  const std::string& why() const { return why_; }
  // The opening (complete once past the first stage) and the socket (valid when kDone).
  const std::vector<uint8_t>& opening() const { return opening_; }
  net::Socket release() { return std::move(sock_); }

 private:
  net::Socket sock_;
  std::string address_;
  Clock::time_point deadline_;
  std::vector<uint8_t> opening_;
  size_t have_ = 0;
  bool challenged_ = false;
  Proof proof_{};
  size_t proofHave_ = 0;
  Nonce nonce_{};
  std::string why_;
};

// The acceptor's handshakes in progress on one listener, for a poll loop that also waits on
// other things: accepted connections join it, it adds their descriptors to the loop's poll set,
// and after each poll it advances the readable (or expired) ones. At most `limit` run at once:
// a connection beyond that drops the oldest (a flood of silent connections cannot grow it).
// Used by the tcp transport's setup and healing and by the RPC server.
class InboundSet {
 public:
  struct Accepted {
    std::vector<uint8_t> opening;  // the dialer's opening, checked and authenticated
    net::Socket socket;            // blocking again, positioned after the handshake
  };
  struct Refused {
    std::string address;
    std::string why;
  };

  InboundSet(size_t openingBytes, size_t limit) : openingBytes_(openingBytes), limit_(limit) {}

  // How long the listener is left out of the poll after a failed accept.
  static constexpr std::chrono::milliseconds kAcceptBackoff{50};

  // Accepts every connection waiting on the non-blocking `listenFd`, each to finish its
  // handshake by `deadline`. `dropped` gets the address of each handshake dropped for the
  // limit. A failed accept other than EAGAIN and EINTR (out of descriptors, say) leaves the
  // connection queued for a later call and the listener out of listenerPollFd() for
  // kAcceptBackoff, since it stays readable and polling it would spin. Returns that errno when
  // it begins a run of failures (the caller logs acceptFailure() once), else 0.
  int acceptAll(int listenFd, Clock::time_point deadline, std::vector<std::string>& dropped);
  // The listener's pollfd: POLLIN, or no events while a failed accept backs off (then `wake`
  // is lowered to the back-off's end).
  pollfd listenerPollFd(int listenFd, Clock::time_point& wake) const;
  // While accepts fail: what failed, how often and since when, and for EMFILE / ENFILE the
  // open-file limit ("accept failed 12 times over 600 ms: Too many open files (errno 24); the
  // connections wait in the listen queue; this process may open 64 descriptors (ulimit -n)").
  // Empty once an accept succeeded or none failed.
  std::string acceptFailure() const;
  // How long accepts have been failing for want of descriptors (EMFILE or ENFILE), without one
  // that succeeded in between; zero when the last accept did not fail so.
  Clock::duration outOfDescriptorsFor() const;
  // Appends one pollfd per handshake to `fds` (POLLIN) and lowers `wake` to the earliest
  // handshake deadline.
  void addPollFds(std::vector<pollfd>& fds, Clock::time_point& wake) const;
  // After a poll of the set addPollFds() made, starting at fds[first] (no acceptAll() in
  // between, which would shift the handshakes against the descriptors): advances each handshake
  // that is readable or past its deadline. Finished ones leave the set into `done`, failed ones
  // into `refused` (an exception while answering, from the MAC or the nonce, refuses that one
  // connection with the reason and leaves the others).
  void advance(std::span<const pollfd> fds, size_t first, const Key& key, std::string_view label,
               const Inbound::Check& check, std::vector<Accepted>& done,
               std::vector<Refused>& refused);
  size_t size() const { return pending_.size(); }
  // Closes every handshake in progress.
  void clear() { pending_.clear(); }

 private:
  size_t openingBytes_, limit_;
  std::vector<Inbound> pending_;
  int acceptErrno_ = 0;        // the last failed accept's, until one succeeds
  size_t acceptFailures_ = 0;  // failed accepts since the first of this run of failures
  Clock::time_point failingSince_{}, backoffUntil_{};
};

}  // namespace loom::auth
