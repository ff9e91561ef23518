// ShmTransport: the Transport (transport.h) between the ranks of a Context that share a host,
// over a shared-memory segment (segment.h); RoutingTransport (routing_transport.h) puts it in
// front of tcp for those peers.
//
// How it works
// - For every ordered pair of local ranks (s -> d) the segment holds a single-producer,
//   single-consumer byte ring: `head` (bytes s ever wrote, written only by s) and `tail`
//   (bytes d ever consumed, written only by d), each in its own cache line, then `ringBytes`
//   of data. A message is a 32-byte header (tag, bytes, the collective's signature's two words)
//   followed by its payload padded to 16 bytes (a header may wrap: it is copied in two pieces
//   then). Messages to one peer go out in isend order.
// - Sending copies as much of the oldest queued send as fits into the ring, publishes `head`
//   and rings the receiver's doorbell; the send completes once its last byte is in the ring
//   (the caller's buffer is free again, as with tcp once the kernel took the bytes).
// - Receiving reads headers in order and matches each (TagMatcher, tag_matcher.h) to the
//   oldest posted receive with the same tag; with none, the message goes into an unexpected
//   buffer that a later irecv takes (if it is still arriving, the rest lands in the caller's
//   buffer directly). A ring therefore always drains, so a send never waits on what its
//   receiver's thread does.
// - Progress: isend/irecv and any thread waiting on a request move data themselves (spinning
//   for a while with the transport's lock held only briefly); a progress thread does the
//   same when nobody waits, sleeping on this rank's doorbell (a futex word in the segment)
//   with a 20 ms timeout. A writer wakes the doorbell only when the owner's progress thread
//   sleeps and no thread of it is polling, so a busy exchange costs no system calls.
// - Failure: every 20 ms the progress thread checks the group's abort flag, the sibling
//   transport (tcp), and whether the peers it has requests with are alive (pid) or closed
//   their transport. A dead peer, an abort or a size mismatch fails every request of this
//   transport with an IoError and marks the group aborted, so every local rank fails fast. A
//   peer that destroyed its transport after its last message (goodbye) only fails requests
//   that need it.
//
// Thread-safety: isend/irecv/abort from any thread; one lock (mu_) guards the queues (the
// peers' send queues and tag matchers) and the local ring cursors; the progress thread and
// waiting threads take it in turns. Nothing else is locked under it (a request finishing
// under it wakes nobody: notifyCompletion() is a futex word).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/transport.h"
#include "shm/os.h"
#include "tag_matcher.h"

namespace loom {
class Store;
}

namespace loom::comm::shm {

class Segment;

struct ShmTransportOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string keyPrefix = "comm/shm/p2p";
  // Ring bytes per ordered pair; 0 = 1 MiB up to 4 local ranks, 256 KiB beyond
  // (ContextOptions::shmRingBytes).
  size_t ringBytes = 0;
  // As ArenaOptions: the memfd, and the wait budgets in µs (< 0: waitBudget's defaults).
  bool memfd = true;
  int spinUs = -1;
  int yieldUs = -1;
};

class ShmRequest;

class ShmTransport final : public Transport {
 public:
  // Collective over the ranks in `local` (the Context ranks on this host, increasing, this
  // rank among them); `rank` and `size` are the Context's.
  static std::unique_ptr<ShmTransport> create(Store& store, int rank, int size,
                                              const std::vector<int>& local,
                                              const ShmTransportOptions& options);
  ~ShmTransport() override;

  // True when `peer` (a Context rank) is on this host.
  bool reaches(int peer) const;
  // Polled for failure and aborted with this transport (tcp, for the other peers); may be null.
  // Set once, before first use; the progress thread may already read it (hence atomic).
  void setSibling(Transport* sibling) { sibling_.store(sibling, std::memory_order_release); }

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr isend(int peer, const void* data, size_t bytes, uint64_t tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, uint64_t tag) override;
  void abort(const std::string& reason) override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  std::string peerAddress(int peer) const override;
  std::string describeUnexpected(int peer) const override;
  bool probe(int peer, uint64_t tag) const override;

 private:
  friend class ShmRequest;
  struct Header;
  struct Control;
  struct Ring;
  struct Peer {
    Peer(int self, int peer) : rank(peer), matcher(self, peer) {}
    // Sends queued, or receives posted, or a message half read: this rank needs the peer.
    bool busy() const { return !sends.empty() || matcher.waiting() || matcher.incoming().active; }

    const int rank;  // Context rank
    std::deque<std::shared_ptr<ShmRequest>> sends;
    bool headerSent = false;
    size_t sent = 0;    // of the front send's padded payload
    uint64_t head = 0;  // our outgoing ring's head (mirrors ring.head)
    // Posted receives, unexpected messages and the message being read (matcher.incoming():
    // its payload lands at target + got).
    TagMatcher matcher;
    size_t inPadded = 0;    // the incoming payload rounded up to 16
    size_t inConsumed = 0;  // of inPadded, taken from the ring
    uint64_t tail = 0;      // the incoming ring's tail (mirrors ring.tail)
    std::atomic<bool> sendsPending{false};
  };

  ShmTransport(int rank, int size, std::vector<int> local, size_t ringBytes, WaitBudget budget,
               std::unique_ptr<Segment> segment);

  int indexOf(int peer) const;  // local index, or -1
  Control& control(int index) const;
  Ring& ring(int from, int to) const;
  uint8_t* ringData(int from, int to) const;

  // All under mu_. progressLocked returns true when something moved.
  bool progressLocked();
  bool pushSendsLocked(int index);
  bool drainLocked(int index);
  void matchHeaderLocked(int index, uint64_t tag, size_t bytes, const Signature& signature);
  void completeIncomingLocked(int index);
  // `invalid`: the ranks' calls disagree (a mismatch): every request, here and on the ranks
  // that learn it from the abort, fails with InvalidArgumentError.
  void failLocked(const std::string& reason, bool propagate, bool invalid = false);
  // Whether the transport was aborted (by any rank): then fails it with the abort's reason
  // (checkHealthLocked) and returns true.
  bool failedByAbortLocked();
  void checkHealthLocked();
  void failClosedPeerLocked(int index);
  bool busyLocked() const;

  // Lock-free: is there anything a progress pass would move?
  bool workVisible() const;
  void ringDoorbell(int index);
  void notifyCompletion();
  // For waiting requests: one progress pass if the lock is free; true when data moved.
  bool tryProgress();
  void beginPolling();
  void endPolling();
  // Sleeps until a request completes or `ns` passed.
  void waitForCompletion(uint32_t seen, long ns);
  uint32_t completions() const { return completions_.load(std::memory_order_acquire); }
  void progressThread();

  const int rank_;
  const int size_;
  const std::vector<int> local_;
  const int me_;  // this rank's local index
  const size_t ringBytes_;
  const WaitBudget budget_;  // how long a waiting request spins, then yields (os.h)
  std::unique_ptr<Segment> segment_;
  Header* header_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by local index (ours unused)

  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::string failure_;                                           // under mu_
  RequestCore::Failure failureKind_ = RequestCore::Failure::kIo;  // under mu_
  std::atomic<uint32_t> completions_{0};
  std::atomic<int> completionWaiters_{0};
  std::atomic<bool> stop_{false};
  std::atomic<Transport*> sibling_{nullptr};
  int64_t lastHealthNs_ = 0;
  std::thread thread_;
};

}  // namespace loom::comm::shm
