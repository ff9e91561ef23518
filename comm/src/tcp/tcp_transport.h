// TcpTransport: the Transport over one TCP connection per peer pair (full mesh).
//
// How it works
// - Setup (create): every rank claims its rank under `<keyPrefix>/claim/<rank>` (a second
//   process with that rank is refused: loom/store/rank_claim.h), listens on an ephemeral port
//   and publishes "host:port" under `<keyPrefix>/addr/<rank>` in the Store; a rank whose setup
//   fails says why under `<keyPrefix>/setup-failed` and the others stop naming it
//   (loom/store/setup_failure.h); rank r connects to every lower rank and accepts
//   from every higher one, TcpOptions::sockets connections (lanes) per pair; the connecting
//   side sends a hello {magic, rank, to, size, lane, lanes, heals, nonce} and the pair runs
//   the authentication handshake (loom/store/peer_auth.h: each side proves it holds the key
//   the first rank put under `<keyPrefix>/auth-key`; docs/heal.md says what that protects).
//   The accepting side handshakes every connection at once in one poll loop and drops one
//   that fails (logged with its address), so a stranger can neither take a peer's place nor
//   stall or fail the setup. Sockets get TCP_NODELAY and are then non-blocking.
// - Lanes: each lane is a connection with its own send queue, reader and tag matcher. A
//   message of at least TcpOptions::stripeBytes is cut into one part per lane (stripePart:
//   the same cut on both sides, since sends and receives must agree on the size) and each
//   part travels as an ordinary message with the same tag on its lane; smaller messages take
//   lane 0. So several cores (sender's and receiver's kernel work) can move one message.
// - Wire format: each message is a 40-byte Header {magic, kind, tag, bytes, signature (2 words)}
//   followed by the payload. kind is data, goodbye (sent by the destructor: a later EOF is a clean
//   close) or abort (payload: the reason, so that peers can name the original failure).
// - Sending: isend writes header and payload (in sendmsg calls of at most kMaxSendBytes, so
//   that the receiver can copy out while the rest is copied in) straight from the caller's
//   thread when nothing is queued for that peer; what the socket does not take is queued and
//   finished by the progress thread on EPOLLOUT (or by the waiting thread, see below).
// - Receiving: a per-peer reader state machine (header, then payload). Small reads go
//   through a 64 KiB staging buffer (one recv usually brings header and payload); a payload
//   of at least kDirectBytes is read straight into the matched receive buffer. A header with
//   no matching posted receive allocates an unexpected message.
// - Progress: one epoll thread per transport (level-triggered EPOLLIN on every socket, plus
//   EPOLLOUT while a send queue is non-empty). A thread waiting on a Request first spins for
//   up to LOOM_SPIN_US (default 50 µs; only for messages up to 64 KiB) driving that peer's
//   socket itself (try-lock, so it never blocks the progress thread). Then it drives all the
//   sockets itself: first busy, with non-blocking passes over every socket (yielding between
//   passes) for as long as bytes keep moving and until TcpOptions::busyPollUs passes without
//   any (so a transfer never waits on a wake-up, which costs tens of µs on a VM), then
//   blocked in poll() (on the sockets and a notification eventfd), while the
//   progress thread stands aside (it idles while `driving_` > 0, and for kLinger after the
//   last wait ended, waking only on its timeout: no eventfd write, no wake-up per wait). So a
//   small message
//   completes without any thread wake-up, and a large transfer is moved by the thread that
//   also reduces, instead of two threads per rank fighting for two cores. The progress thread
//   moves data while the caller is busy elsewhere (reducing, or between collectives).
// - Failure: a corrupt header, an abort from a peer or a mismatch fail the whole transport
//   (every pending and future request throws IoError naming the peer) and shut every socket
//   down, so that the failure reaches every peer within milliseconds. A lost connection (EOF
//   without goodbye, ECONNRESET, EPIPE, ETIMEDOUT, unreachable) does the same when it does not
//   heal (TcpOptions::reconnectMs 0, or a same-host connection without healLocal); when it
//   heals, it is re-established and the unread bytes re-sent (tcp_heal.cc), and only a dead
//   peer or the bound passing fails the transport.
//
// Files: tcp_setup.cc (connect, teardown), tcp_transport.cc (data path, failure),
// tcp_progress.cc (who moves bytes), tcp_request.cc (waiting), tcp_heal.cc (lost connections
// re-established), replay_ring.h (what a healing connection keeps), peer.h (wire format,
// state).
//
// Tag matching (posted receives, unexpected messages) is the shared TagMatcher
// (tag_matcher.h), one per peer under its recvMu; a large message nobody waits for is its
// held message while its payload stays in the socket.
//
// Locks: Peer::recvMu and Peer::sendMu are held together only in fail(), lose() and around
// installLocked() (tcp_heal.cc), each taking recvMu before sendMu. Peer::epollMu and failMu_ are
// leaf locks. A request finishing under recvMu or sendMu may write the notification eventfd (no
// lock).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/common/socket.h"
#include "loom/store/peer_auth.h"

namespace loom {
class Store;
}

namespace loom::comm {
class RequestCore;
}

namespace loom::comm::tcp {

struct TcpOptions {
  milliseconds timeout{std::chrono::minutes(5)};  // connection setup
  std::string host;                               // address to listen on and publish
  std::string keyPrefix = "loom/tcp";             // Store keys
  // SO_SNDBUF/SO_RCVBUF: > 0 that size; 0 the default (kDefaultBufferBytes in peer.h, which
  // is 0: kernel autotuning); < 0 autotuning.
  int bufferBytes = 0;
  // How long a waiter keeps polling the sockets without blocking after bytes last moved, in
  // µs: >= 0 that long (0: block at once); < 0 the default (kDefaultBusyPollUs in peer.h).
  int busyPollUs = -1;
  // Bytes handed to one sendmsg call (ContextOptions::tcpSendBytes); 0: kMaxSendBytes (peer.h).
  size_t sendBytes = 0;
  // How long a wait on a small message spins, in µs (ContextOptions::tcpSpinUs); < 0:
  // kDefaultSpinUs (peer.h).
  int spinUs = -1;
  // Connections per peer pair, in [1, 16]; 0: kDefaultSockets (peer.h). Equal on all ranks
  // (ContextOptions::tcpSockets).
  int sockets = 0;
  // Messages of at least this many bytes are striped across the connections; 0:
  // kDefaultStripeBytes (peer.h).
  size_t stripeBytes = 0;
  // How long a lost connection to a live peer may take to be re-established, in ms
  // (ContextOptions::tcpReconnectMs); 0: a lost connection fails the transport at once.
  // Zero on all ranks or on none.
  int reconnectMs = 0;
  // Whether connections between two ranks of one host heal too (ContextOptions::tcpHealLocal):
  // their replay copy costs more than it is likely to save (tcp_heal.cc).
  bool healLocal = false;
};

class TcpRequest;
struct Peer;
struct Fault;
struct Hello;

class TcpTransport : public Transport {
 public:
  static std::unique_ptr<TcpTransport> create(Store& store, int rank, int size,
                                              const TcpOptions& options);
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr isend(int peer, const void* data, size_t bytes, uint64_t tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, uint64_t tag) override;
  void abort(const std::string& reason) override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  std::string peerAddress(int peer) const override;
  std::string describeUnexpected(int peer) const override;
  uint64_t unexpectedBytes() const override;
  bool probe(int peer, uint64_t tag) const override;

  // Connections per peer.
  int lanes() const { return lanes_; }
  // Part `lane` of a striped message of `bytes`: its byte offset and length (64-byte aligned
  // cuts; the last part takes the rest).
  std::pair<size_t, size_t> stripePart(size_t bytes, int lane) const;

  // How long TcpRequest::wait spins on a small message (LOOM_SPIN_US at setup).
  Clock::duration spinTime() const { return spin_; }
  // Used by TcpRequest::wait while spinning: drive one peer's socket without blocking.
  void pollPeer(int peer, bool send);
  // Used by TcpRequest::wait around its whole wait (spin and drive): while any thread waits,
  // the progress thread stands aside, and it stays parked for kLinger after the last wait
  // ended, so that back-to-back waits (the steps of a collective, consecutive collectives)
  // never wake it.
  void beginWait(const TcpRequest* request);
  void endWait();
  // Used by TcpRequest::wait after spinning: the waiting thread drives every socket itself,
  // polling without blocking while bytes move (busy_), then blocking in poll(), until
  // `request` finished or `end` passes. Returns true when it finished.
  bool drive(const RequestCore& request, Clock::time_point end);
  // Wakes a thread blocked in drive() (a request completed on another thread).
  void notifyDriver();

  // Testing only (tests/comm/heal_test.cc): once `bytes` more bytes were written on connection
  // `lane` to `peer`, that connection is reset (both ends see it fail) and heals, or fails the
  // transport when it does not heal; `times` resets, `bytes` of writing apart.
  void testResetAfter(int peer, int lane, uint64_t bytes, int times = 1);
  // Whether connection `lane` to `peer` heals, and how many times connections were re-established.
  bool heals(int peer, int lane) const;
  int reconnects() const { return reconnects_.load(); }

 private:
  TcpTransport(int rank, int size);
  void start();
  void progressLoop();
  // Read what the socket has (bounded per call) / write what is queued; a fault on failure.
  Fault progressRecvLocked(Peer& p);
  Fault progressSendLocked(Peer& p);
  // `error` set: the stream cannot go on; `invalid` set with it: a mismatch (the callers').
  void onHeaderLocked(Peer& p, std::string& error, bool& invalid);
  void onPayloadDoneLocked(Peer& p);
  void updateEpollLocked(Peer& p, bool wantOut);
  void setEpollMask(Peer& p);
  void resumeLocked(Peer& p);
  // `invalid`: the ranks' calls disagree (a mismatch): every request, here and on the peers
  // that learn it from the abort, fails with InvalidArgumentError.
  void fail(const std::string& reason, bool notifyPeers, bool invalid = false);
  // A fault found while driving `p`: a lost connection that heals starts healing, anything else
  // fails the transport.
  void onFault(Peer& p, const Fault& fault);
  // Healing (tcp_heal.cc).
  Fault lostFault(Peer& p, std::string text) const;
  void lose(Peer& p, uint64_t gen, const std::string& why);
  void healLoop();
  void healStep(Peer& p, Clock::time_point now);
  void acceptResume();
  // Drives the resume handshakes in progress (resuming_) whose sockets poll found ready.
  void advanceResumes(const std::vector<struct pollfd>& fds, size_t first);
  void resumeAccepted(const Hello& hello, net::Socket s);
  // Installs `sock` as `p`'s socket and rewinds `p`'s stream to `peerConsumed`; "" or why not.
  std::string installLocked(Peer& p, net::Socket sock, uint64_t peerConsumed);
  void afterInstall(Peer& p);
  void stopHealer();
  std::shared_ptr<TcpRequest> failedRequest(int peer, bool send, const void* data, size_t bytes,
                                            uint64_t tag);
  void checkPeer(int peer) const;
  Peer& conn(int peer, int lane) const { return *conns_[peer * lanes_ + lane]; }
  std::shared_ptr<TcpRequest> sendOn(Peer& p, const void* data, size_t bytes, uint64_t tag);
  std::shared_ptr<TcpRequest> recvOn(Peer& p, void* data, size_t bytes, uint64_t tag);
  // Appends `req` (finished being written) to `p`'s replay ring.
  void keepForReplayLocked(Peer& p, const TcpRequest& req);

  const int rank_;
  const int size_;
  int lanes_ = 1;
  size_t stripeBytes_ = 0;
  // Connection `lane` to rank r at r * lanes_ + lane; null for self.
  std::vector<std::unique_ptr<Peer>> conns_;
  int epollFd_ = -1;
  int wakeFd_ = -1;                      // eventfd: stop the progress thread
  int notifyFd_ = -1;                    // eventfd: a request completed while its waiter drives
  std::atomic<int> driving_{0};          // threads inside a wait; the progress thread idles then
  std::atomic<int64_t> lastWaitEnd_{0};  // steady clock ns when the last wait ended
  std::atomic<uint64_t> moved_{0};       // bytes sent + received, for the busy phase of drive()
  Clock::duration busy_{0};              // see TcpOptions::busyPollUs
  size_t sendStep_ = 0;      // bytes per sendmsg call (kMaxSendBytes, LOOM_TCP_SEND_BYTES)
  Clock::duration spin_{0};  // see spinTime()
  std::thread progress_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex failMu_;
  std::string failure_;          // guarded by failMu_
  bool failureInvalid_ = false;  // likewise

  // Healing (tcp_heal.cc): the listener stays open while connections heal; the healer thread
  // accepts and dials replacement connections.
  milliseconds reconnect_{0};
  int bufferBytes_ = 0;  // SO_SNDBUF/SO_RCVBUF of every socket (> 0), else autotuning
  net::Socket listener_;
  auth::Key key_{};  // the group's key (setup and resume handshakes)
  // Resume handshakes in progress (healer thread only).
  auth::InboundSet resuming_;
  std::vector<std::string> peerAddrs_;  // every rank's listening "host:port"
  int healWakeFd_ = -1;                 // eventfd: a connection was lost, or stop
  std::thread healer_;
  std::atomic<int> reconnects_{0};
};

}  // namespace loom::comm::tcp
