// The tcp transport's private pieces shared by its .cc files: the wire format, the request
// object and the per-peer state (see tcp_transport.h for how they work together).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/store/peer_auth.h"
#include "request_core.h"
#include "tag_matcher.h"
#include "tcp/replay_ring.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::tcp {

constexpr uint32_t kMagic = 0x4d4f4f4c;  // "LOOM" little-endian
// 3: the hello says whether the connection heals (TcpOptions::reconnectMs), and a
// re-established connection opens with a Resume instead of a Hello.
// 4: the header carries the signature's second word (the count's high bits, the split sizes'
// digest).
// 5: every connection opens with the authentication handshake (loom/store/peer_auth.h): the
// hello and the resume are one struct (Hello) holding the dialer's nonce and the acceptor's rank.
constexpr uint32_t kHelloVersion = 5;
enum Kind : uint32_t { kData = 1, kGoodbye = 2, kAbort = 3 };
// An abort's Header::tag: 1 when the ranks' calls disagree (a mismatch), so that the peers' errors
// are InvalidArgumentError too; 0 otherwise.
constexpr uint64_t kAbortInvalid = 1;

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t tag;
  uint64_t bytes;
  uint64_t signature;       // the collective's (signature.h) word, 0 for point-to-point and control
  uint64_t signatureExtra;  // its second word
};
static_assert(sizeof(Header) == 40);

// The first bytes on a connection re-established after a loss (tcp_heal.cc) carry this magic
// instead of kMagic: the side that dialled the lost connection dials the peer's listener again
// and says which connection it replaces and how much of the peer's stream it consumed; the peer
// answers with a ResumeReply saying how much of the dialler's stream it consumed. Each side then
// sends again from the other's count. A resume from the side that accepted the connection (the
// lower rank) is its liveness check of the dialler, and asks it to redial that connection (no
// reply).
constexpr uint32_t kResumeMagic = 0x4d55534c;  // "LSUM"

// The opening of every connection (the authentication handshake's opening: the acceptor answers
// with a Challenge, the dialer with a Proof, peer_auth.h; the MACs cover all of it). magic:
// kMagic at setup, kResumeMagic for a replacement.
struct Hello {
  uint32_t magic;
  uint32_t version;  // kHelloVersion
  int32_t rank;      // the dialer
  int32_t to;        // the acceptor
  int32_t size;
  int32_t lane;       // which of the pair's connections this is
  int32_t lanes;      // connections per pair on the connecting rank (must match)
  int32_t heals;      // 1: the connecting rank keeps a replay ring for this connection (must match)
  uint64_t consumed;  // resume: bytes of the peer's stream on this connection this rank read
  uint8_t nonce[auth::kNonceBytes];
};
static_assert(sizeof(Hello) == 56 && sizeof(Hello) % alignof(Hello) == 0);
// The handshake's protocol label (a MAC made for another protocol is refused).
constexpr std::string_view kAuthLabel = "loom-tcp";
// How long an accepted connection may take to complete its handshake (setup and healing);
// a connection that says nothing is dropped then. The dialer answers within a round trip.
constexpr milliseconds kHandshakeTimeout{10000};
// Handshakes in progress at once on one listener; a new connection beyond it drops the oldest
// (a flood of silent connections cannot keep a real peer out for long).
constexpr size_t kMaxHandshakes = 64;
// How long setup keeps retrying accepts that fail for want of descriptors (EMFILE, ENFILE)
// before it fails naming the limit: long enough for a passing shortage (another thread's files
// closing), not the whole setup timeout for a limit nothing will raise.
constexpr milliseconds kOutOfDescriptorsGrace{5000};

inline Hello makeHello(uint32_t magic, int rank, int to, int size, int lane, int lanes, bool heals,
                       uint64_t consumed) {
  Hello h{magic, kHelloVersion, rank, to, size, lane, lanes, heals ? 1 : 0, consumed, {}};
  const auth::Nonce nonce = auth::randomNonce();
  std::memcpy(h.nonce, nonce.data(), sizeof(h.nonce));
  return h;
}

inline std::span<const uint8_t> bytesOf(const Hello& h) {
  return {reinterpret_cast<const uint8_t*>(&h), sizeof(h)};
}

// Whether `h`, the opening of a connection to the listener of rank `rank` (of `size`, `lanes`
// connections a pair), re-establishes one of its connections: from a Loom tcp transport of the
// same version and shape, addressed to this rank, naming another rank and a lane in range.
// tcp_heal.cc checks the magic, version and addressee before the handshake and all of it after.
inline bool isResumeFor(const Hello& h, int rank, int size, int lanes) {
  return h.magic == kResumeMagic && h.version == kHelloVersion && h.to == rank && h.size == size &&
         h.lanes == lanes && h.rank >= 0 && h.rank < size && h.rank != rank && h.lane >= 0 &&
         h.lane < lanes;
}

struct ResumeReply {
  uint32_t magic;
  uint32_t status;  // 0: resumed; else refused (the payload of the connection is not known)
  uint64_t consumed;
};

// Connections per peer pair when TcpOptions::sockets is 0, and the message size from which a
// message is striped across them (TcpOptions::stripeBytes 0). One connection: on the 2-core
// dev VM (bench/peers/ab.sh, 2 ranks, 3 interleaved rounds on a loaded machine,
// docs/results/2026-11-25-single-copy.md) two connections per pair were ahead in some cells
// (all-reduce to 1 MiB, all-gather 1-16 MiB) and behind in others (all-reduce 4 MiB, broadcast
// 64 MiB), and four lost nearly everywhere: loopback's cost is the CPU copying, and with two
// ranks both cores already copy. Hosts with more cores per rank may gain (LOOM_TCP_SOCKETS).
constexpr int kDefaultSockets = 1;
constexpr size_t kDefaultStripeBytes = 256 << 10;
// The parts of a striped message carry their message's tag with this bit set (no OpType
// reaches 128, tag.h), so that a striped part never matches an unstriped receive of the same
// tag when the two sides disagree on the size: they fail as a mismatch instead.
constexpr uint64_t kStripedTag = uint64_t{1} << 63;
// The epoll id of the progress thread's wake fd (connections use their index).
constexpr uint64_t kWakeId = ~uint64_t{0};

// SO_SNDBUF/SO_RCVBUF when TcpOptions::bufferBytes is 0: 0 = the kernel's autotuning, unless
// LOOM_TCP_BUFFER_BYTES names a size. Measured on loopback (bench/kernels/README.md): a fixed
// 128 KiB keeps the bytes in flight in cache and lowers the CPU per byte by ~15% when other
// work competes for the cores, but on a less loaded machine autotuning gave 10-35% more
// all-reduce busbw (fewer wake-ups), so it stays the default.
constexpr size_t kDefaultBufferBytes = 0;

// TcpOptions::busyPollUs when neither the option nor LOOM_TCP_BUSY_US sets it. A thread that
// blocks in poll() and is woken by the next segment costs tens of µs per wake-up on a VM
// (the idle vCPU halts); polling while bytes flow gave loopback broadcast and all-reduce
// 1.2-1.8x the bandwidth at 1-64 MiB on the 2-core dev VM (docs/bench.md). Between passes
// the poller yields, so ranks sharing a core still take turns.
constexpr int kDefaultBusyPollUs = 1000;

// Bytes handed to one sendmsg call; a larger message takes several calls in one pass. Linux
// pushes the segments of a write to the peer when the call returns (or once half a window is
// queued), so one multi-MiB call may copy it all before the receiver starts copying out; in
// steps the two cores can copy at once (Open MPI writes 128 KiB fragments). Measured with
// bench/peers/ab.sh (LOOM_SHM=0, interleaved rounds; docs/bench.md): broadcast, one whole
// message per send, gained up to 1.4x at 2 ranks with 256 KiB steps (512 KiB: about half of
// that) in some sets of rounds and nothing in others; the 4-rank all-reduce, whose messages
// are 512 KiB chunks, looked slightly slower with 256 KiB steps. 512 KiB leaves the chunked
// algorithms' messages whole. LOOM_TCP_SEND_BYTES overrides it.
constexpr size_t kMaxSendBytes = 512 << 10;

constexpr size_t kStageBytes = 64 << 10;
constexpr size_t kDirectBytes = 16 << 10;
constexpr size_t kMaxBytesPerPoll = 2 << 20;  // per socket per pass, so threads can take turns
constexpr size_t kMaxAbortText = 4096;
// An unexpected message larger than this is left in the socket (flow control holds the
// sender back) until a receive is posted, so that it lands in place instead of in a
// freshly allocated buffer; smaller ones are buffered at once.
constexpr size_t kEagerBytes = 64 << 10;

// Messages up to this size spin before blocking; larger transfers go straight to drive().
constexpr size_t kSpinBytes = 64 << 10;
// How long a waiter on a small message spins (TcpTransport::spinTime) unless LOOM_SPIN_US
// says otherwise.
constexpr int kDefaultSpinUs = 50;
// True on a thread inside TcpRequest::wait (it drives sockets itself).
extern thread_local bool tlsDriving;
class TcpRequest;
// The request this thread waits on (its completion needs no wake-up).
extern thread_local const TcpRequest* tlsWaiting;
// The progress thread stays parked this long after the last wait ended.
constexpr auto kLinger = std::chrono::milliseconds(2);

// A tcp request: the shared core (request_core.h) plus the wire header of a send, and how a
// waiter waits (tcp_request.cc).
class TcpRequest final : public RequestCore {
 public:
  TcpRequest(TcpTransport* transport, int peer, bool send, const void* data, size_t bytes,
             uint64_t tag)
      : RequestCore(peer, send, data, bytes, tag),
        transport_(transport),
        header_{kMagic, kData, tag, bytes, signature().word, signature().extra} {}

  bool wait(const Deadline& deadline) override;

  TcpTransport* const transport_;
  Header header_;

 private:
  // A waiter that gave up spinning may sleep in drive()'s poll(): wake it, unless the
  // finishing thread is that waiter itself.
  void onFinished() override {
    if (sleeping_.load() && tlsWaiting != this) transport_->notifyDriver();
  }

  std::atomic<uint32_t> sleeping_{0};
};

// One send or receive striped across a peer's connections: part k carries bytes
// [begin_k, begin_k + count_k) of the message on lane k (stripePart). Done when every part
// is; the parts are ordinary requests of their lanes.
class StripedRequest final : public Request {
 public:
  StripedRequest(int peer, bool send, size_t bytes, uint64_t tag,
                 std::vector<std::shared_ptr<TcpRequest>> parts)
      : peer_(peer), send_(send), bytes_(bytes), tag_(tag), parts_(std::move(parts)) {}

  bool test() override {
    bool all = true;
    for (size_t k = 0; k < parts_.size(); ++k)
      all = explained(k, [&] { return parts_[k]->test(); }) && all;
    return all;
  }
  bool wait(const Deadline& deadline) override {
    for (size_t k = 0; k < parts_.size(); ++k) {
      if (!explained(k, [&] { return parts_[k]->wait(deadline); })) return false;
    }
    return true;
  }
  int peer() const override { return peer_; }
  bool isSend() const override { return send_; }
  size_t bytes() const override { return bytes_; }
  uint64_t tag() const override { return tag_; }
  size_t bytesOutstanding() const override {
    size_t left = 0;
    for (auto& p : parts_) left += p->bytesOutstanding();
    return left;
  }

 private:
  // A part's size mismatch names the part's sizes: say which message it belongs to.
  template <typename F>
  bool explained(size_t k, F&& f) {
    try {
      return f();
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(detail::str(e.what(), " [part ", k, " of a ", bytes_,
                                             "-byte message striped across ", parts_.size(),
                                             " connections]"));
    }
  }

  const int peer_;
  const bool send_;
  const size_t bytes_;
  const uint64_t tag_;
  std::vector<std::shared_ptr<TcpRequest>> parts_;
};

// A failure of a connection's socket, or of what it carried. `lost`: the connection itself
// broke (reset, closed without goodbye, timed out, unreachable), which heals when the
// connection heals; otherwise (a corrupt stream, an abort, a mismatch) the transport fails.
// `gen`: the socket generation it happened on (a later socket is not lost by it).
struct Fault {
  std::string text;
  bool lost = false;
  uint64_t gen = 0;
  bool invalid = false;  // the ranks' calls disagree: InvalidArgumentError on every rank
  explicit operator bool() const { return !text.empty(); }
};

// One connection to a peer (a peer has TcpTransport::lanes() of them).
struct Peer {
  Peer(int self, int peer, int lane, int index)
      : rank(peer), lane(lane), index(index), matcher(self, peer) {}

  const int rank;
  const int lane;
  const int index;  // in TcpTransport::conns_, and the connection's epoll id
  net::Socket sock;
  std::atomic<int> pollFd{-1};  // sock's fd, for drive()'s lock-free poll list
  std::string addr;
  std::atomic<bool> inEpoll{false};

  // Healing (tcp_heal.cc). `gen` changes, and `sock` is replaced, only with recvMu and sendMu
  // both held; `reconnecting` is set and cleared likewise (read anywhere).
  bool heals = false;   // a lost socket is re-established (TcpOptions::reconnectMs, both sides)
  bool dialer = false;  // this rank dialled the connection (and dials it again)
  uint64_t gen = 1;
  std::atomic<bool> reconnecting{false};
  // While reconnecting, the healer's own (its thread only; set by lose() under both locks
  // before `reconnecting` is published).
  Clock::time_point lostAt{};
  Clock::time_point nextTry{};
  std::string lostWhy;                      // what broke the connection
  std::string lastAttempt;                  // why the last redial or probe did not succeed
  uint64_t lostSent = 0, lostReceived = 0;  // stream positions when it broke
  int attempts = 0;
  std::atomic<Clock::time_point> installedAt{Clock::time_point{}};  // the last re-establishment

  std::mutex sendMu;
  std::deque<std::shared_ptr<TcpRequest>> sendQueue;  // front may be partly written
  size_t sendOffset = 0;                              // of header + payload of the front
  bool epollOut = false;
  bool sendClosed = false;
  std::atomic<bool> sendPending{false};  // sendQueue non-empty (read by drive() unlocked)
  uint64_t sent = 0;  // stream position: bytes written to the socket so far (sendMu)
  // The stream up to the front message's first byte, for a resend (heals only; sendMu).
  ReplayRing ring;
  // Bytes to send again before the queue after a reconnect (sendMu), from replayOffset on.
  std::vector<uint8_t> replay;
  size_t replayOffset = 0;
  // TcpTransport::testResetAfter: reset once `sent` reaches testResetAt, testResets times,
  // testResetEvery bytes apart.
  uint64_t testResetAt = 0;
  uint64_t testResetEvery = 0;
  int testResets = 0;

  std::mutex recvMu;
  uint64_t received = 0;  // stream position: bytes read from the socket so far (recvMu)
  // Posted receives, unexpected messages and the message being read (its payload goes to
  // matcher.incoming().target); a stalled message is the matcher's held one.
  TagMatcher matcher;
  bool readingHeader = true;
  Header header{};
  size_t headerGot = 0;
  uint8_t* target = nullptr;  // where the next payload byte goes (data or abort text)
  size_t remaining = 0;       // payload bytes still to read
  bool targetAbort = false;
  bool abortInvalid = false;  // the abort being read says the ranks' calls disagree
  bool stalled = false;       // header read, no receive posted yet, payload left in the socket
  std::atomic<bool> readPaused{false};  // EPOLLIN off while stalled
  std::mutex epollMu;                   // serialises epoll_ctl(MOD) on this socket
  std::string abortText;
  std::unique_ptr<uint8_t[]> stage{new uint8_t[kStageBytes]};
  size_t stageBegin = 0;
  size_t stageEnd = 0;
  bool goodbye = false;  // the peer said goodbye; a later EOF is a clean close
  bool closed = false;   // nothing more will be read
};

}  // namespace loom::comm::tcp
