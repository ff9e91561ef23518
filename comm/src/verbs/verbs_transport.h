// VerbsTransport: the Transport over one RC queue pair per peer (full mesh), written against
// VerbsOps so that the same code runs on libibverbs (IbvOps) and on the in-memory fabric of
// the tests (FakeOps).
//
// Protocol
// - Setup (create): for each peer, this rank allocates and registers a receive ring (`slots`
//   slots of `slotBytes`) and a send staging ring of the same shape, creates the queue pair
//   (moved to INIT), posts slots + kCtrlRecvs zero-length receives, and publishes QpInfo
//   (qp address + ring address and rkey) under "<keyPrefix>/qp/<rank>/<peer>". Then it reads
//   each peer's info, moves the queue pair to RTR and RTS, and waits for every rank's
//   "<keyPrefix>/ready/<rank>" so that nobody writes to a queue pair not yet connected.
// - Data: a message is cut into fragments of at most slotBytes - 40 bytes. Fragment i goes to
//   the peer's ring slot (sender's counter mod slots) by RDMA write with immediate; the slot
//   starts with a SlotHeader {tag, total bytes, offset, signature, fragment bytes}, the
//   immediate says "data, slot k". The signature is the collective's (signature.h), taken by
//   the request from its creating thread; the receiver's tag matcher compares the first
//   fragment's with the posted receive's and fails the transport on a difference, both
//   signatures in the error. The payload is copied into the staging slot, or, when the send buffer
//   lies in a region given to registerBuffer (MR cache), gathered straight from it (two
//   scatter-gather entries: header from the staging slot, payload from the user's memory).
// - Receiving: each immediate consumes one posted receive, which is reposted at once. A
//   fragment is copied from the ring into the matched receive (oldest posted receive with the
//   tag), or into an unexpected message that a later irecv takes. Messages from one peer never
//   interleave (the sender finishes one before starting the next).
// - Flow control: the sender holds one credit per free remote slot (initially `slots`); the
//   receiver returns freed slots in batches of creditThreshold(slots) with a zero-length
//   write whose immediate is "credit, n". A staging slot is reused only after its write
//   completed locally.
// - Completion: a send completes when its last fragment was posted (copy path) or when every
//   fragment's write completed (zero-copy path); a receive when its last fragment was copied.
// - Goodbye / abort: writes with immediate kinds goodbye (destructor, zero-length) and abort
//   (abort(), failure): the peer fails fast instead of waiting for its deadline. An abort
//   first writes its reason (up to kAbortTextBytes) into the abort-text area after the peer's
//   ring, its immediate carries the length, and the peer's error reads "rank R aborted: why".
// - Failure: an unsuccessful completion (retry exceeded: peer gone; remote access error),
//   a corrupt slot header, a size mismatch or a failed post fail the whole transport: every
//   pending and future request throws IoError naming the peer and the cause.
// - Progress: one thread polls the completion queue (blocking in VerbsOps::waitCq when idle);
//   waiters block on a condition variable. One mutex guards all protocol state, the peers'
//   tag matchers (tag_matcher.h) included, and every request's state transitions.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/transport.h"
#include "verbs/verbs_ops.h"

namespace loom {
class Store;
}

namespace loom::comm::verbs {

struct VerbsTransportOptions {
  milliseconds timeout{std::chrono::minutes(5)};  // setup
  std::string keyPrefix = "loom/verbs";
  uint32_t slots = 16;
  uint32_t slotBytes = 64 * 1024;
};

class VerbsRequest;
struct VerbsPeer;

class VerbsTransport : public Transport {
 public:
  static constexpr int kCtrlRecvs = 8;        // receives beyond `slots` for control messages
  static constexpr int kMaxCtrlInFlight = 4;  // credit/goodbye/abort writes not yet completed

  static std::unique_ptr<VerbsTransport> create(Store& store, int rank, int size,
                                                std::unique_ptr<VerbsOps> ops,
                                                const VerbsTransportOptions& options);
  ~VerbsTransport() override;

  const char* name() const override { return "verbs"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr isend(int peer, const void* data, size_t bytes, uint64_t tag) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, uint64_t tag) override;
  // The MR cache: one region per start address (a larger registration replaces a smaller
  // one; unregisterBuffer drops the region at buffer.data, whichever handle it came from).
  RegisteredBuffer registerBuffer(const void* data, size_t bytes) override;
  void unregisterBuffer(const RegisteredBuffer& buffer) override;
  void abort(const std::string& reason) override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  std::string peerAddress(int peer) const override;
  std::string describeUnexpected(int peer) const override;
  bool probe(int peer, uint64_t tag) const override;

  // For tests: registered regions in the MR cache, sends that went zero-copy.
  size_t registeredRegions() const;
  uint64_t zeroCopySends() const;

 private:
  friend class VerbsRequest;
  VerbsTransport(int rank, int size, std::unique_ptr<VerbsOps> ops,
                 const VerbsTransportOptions& options);
  void setup(Store& store);
  void progressLoop();
  void onCompletionLocked(const Completion& c);
  void onDataLocked(VerbsPeer& p, uint32_t slot);
  void pumpLocked(VerbsPeer& p);
  void returnCreditsLocked(VerbsPeer& p);
  void postCtrlLocked(VerbsPeer& p, ImmKind kind, uint32_t arg);
  // The abort, with `reason` in the peer's abort-text area (verbs_ops.h).
  void postAbortLocked(VerbsPeer& p, const std::string& reason);
  void failLocked(const std::string& reason, bool notifyPeers);
  std::shared_ptr<VerbsRequest> makeRequest(int peer, bool send, const void* data, size_t bytes,
                                            uint64_t tag);
  void checkPeer(int peer) const;
  const MemoryRegion* findRegisteredLocked(const void* data, size_t bytes) const;

  const int rank_;
  const int size_;
  const VerbsTransportOptions options_;
  const size_t payloadPerSlot_;
  std::unique_ptr<VerbsOps> ops_;
  std::vector<std::unique_ptr<VerbsPeer>> peers_;  // indexed by rank; null for self

  mutable std::mutex mu_;  // guards all protocol state below and in peers / requests
  std::condition_variable cv_;
  std::map<uintptr_t, MemoryRegion> registered_;  // MR cache: start address -> region
  uint64_t zeroCopySends_ = 0;
  std::string failure_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

}  // namespace loom::comm::verbs
