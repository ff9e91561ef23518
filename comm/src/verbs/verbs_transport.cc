#include "verbs/verbs_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/rank_claim.h"
#include "loom/store/setup_failure.h"
#include "loom/store/store.h"
#include "request_core.h"
#include "tag.h"
#include "tag_matcher.h"

namespace loom::comm::verbs {

namespace {

constexpr uint64_t kCtrlWr = uint64_t{1} << 40;  // wr id of control writes (data: the slot)
constexpr uint64_t kRecvWr = uint64_t{1} << 41;  // wr ids of receives: kRecvWr | index

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

std::unique_ptr<uint8_t, FreeDeleter> allocRing(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) LOOM_THROW(IoError, "cannot allocate a verbs ring of ", bytes, " bytes");
  std::memset(p, 0, bytes);
  return std::unique_ptr<uint8_t, FreeDeleter>(static_cast<uint8_t*>(p));
}

}  // namespace

// A verbs request: the shared core (request_core.h), a send's fragment bookkeeping, and how a
// waiter waits: on the transport's condition variable. Every transition of a verbs request
// happens under the transport's mutex, so a waiter that checked under it cannot miss the
// notification.
class VerbsRequest final : public RequestCore {
 public:
  VerbsRequest(VerbsTransport* t, int peer, bool send, const void* data, size_t bytes, uint64_t tag)
      : RequestCore(peer, send, data, bytes, tag), t_(t) {}

  bool wait(const Deadline& deadline) override {
    if (finished()) return check();
    std::unique_lock<std::mutex> lock(t_->mu_);
    if (!t_->cv_.wait_until(lock, deadline.end(), [&] { return finished(); })) return false;
    return check();
  }

  // Sends, under the transport's mutex.
  size_t offset_ = 0;  // bytes handed to fragments so far
  bool allPosted_ = false;
  const MemoryRegion* mr_ = nullptr;  // zero-copy source
  int fragsInFlight_ = 0;             // zero-copy fragments not yet completed

 private:
  void onFinished() override { t_->cv_.notify_all(); }  // under the mutex (see above)

  VerbsTransport* const t_;
};

struct VerbsPeer {
  VerbsPeer(int self, int peer) : rank(peer), matcher(self, peer) {}

  const int rank;
  std::string addr;  // for messages: "lid L qpn Q"
  QpInfo local, remote;
  std::unique_ptr<uint8_t, FreeDeleter> recvRing, sendRing;
  MemoryRegion recvMr, sendMr;
  // Sending.
  uint32_t credits = 0;
  uint32_t nextSendSlot = 0;
  std::vector<bool> slotBusy;
  std::vector<std::shared_ptr<VerbsRequest>> slotOwner;  // zero-copy fragment in the slot
  std::deque<std::shared_ptr<VerbsRequest>> sendQueue;
  int ctrlInFlight = 0;
  // Receiving.
  uint32_t freed = 0;  // slots consumed, credits not yet returned
  // Posted receives, unexpected messages and the message being received (its fragments land
  // at matcher.incoming().target + offset).
  TagMatcher matcher;
  bool goodbye = false;  // the peer closed after its last message
};

VerbsTransport::VerbsTransport(int rank, int size, std::unique_ptr<VerbsOps> ops,
                               const VerbsTransportOptions& options)
    : rank_(rank),
      size_(size),
      options_(options),
      payloadPerSlot_(options.slotBytes - sizeof(SlotHeader)),
      ops_(std::move(ops)) {}

std::unique_ptr<VerbsTransport> VerbsTransport::create(Store& store, int rank, int size,
                                                       std::unique_ptr<VerbsOps> ops,
                                                       const VerbsTransportOptions& options) {
  LOOM_CHECK(ops != nullptr, "verbs transport: no verbs ops");
  LOOM_CHECK(options.slots >= 2 && options.slots <= (1u << 16), "verbs transport: ", options.slots,
             " slots per peer, expected 2..65536");
  LOOM_CHECK(options.slotBytes > sizeof(SlotHeader) + 64, "verbs transport: slots of ",
             options.slotBytes, " bytes are too small (expected more than ",
             sizeof(SlotHeader) + 64, ")");
  std::unique_ptr<VerbsTransport> t(new VerbsTransport(rank, size, std::move(ops), options));
  t->setup(store);
  t->progress_ = std::thread([p = t.get()] { p->progressLoop(); });
  return t;
}

void VerbsTransport::setup(Store& store) {
  // Before the device is touched: a second process with this rank is refused (rank_claim.h), and
  // its error, published under the failure key, stops the ranks that wait in this setup.
  const std::string failedKey = options_.keyPrefix + "/setup-failed";
  if (size_ > 1) {
    try {
      claimRank(store, detail::str(options_.keyPrefix, "/claim/", rank_), rank_, size_);
    } catch (const InvalidArgumentError& e) {
      publishSetupFailure(store, failedKey, e);
      throw;
    }
  }
  const uint32_t slots = options_.slots;
  const size_t ringBytes = size_t{slots} * options_.slotBytes;
  // The rings end in the abort-text area (verbs_ops.h): the receive ring's is written by the
  // peer, the send ring's is the source of this rank's abort text.
  const size_t areaBytes = ringBytes + kAbortTextBytes;
  const int recvDepth = static_cast<int>(slots) + kCtrlRecvs;
  const int sendDepth = static_cast<int>(slots) + kMaxCtrlInFlight + 2;
  peers_.resize(size_);
  std::vector<std::string> keys, values;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto p = std::make_unique<VerbsPeer>(rank_, r);
    p->recvRing = allocRing(areaBytes);
    p->sendRing = allocRing(areaBytes);
    p->recvMr = ops_->regMr(p->recvRing.get(), areaBytes);
    p->sendMr = ops_->regMr(p->sendRing.get(), areaBytes);
    p->local = ops_->createQp(r, sendDepth, recvDepth);
    p->local.rkey = p->recvMr.rkey;
    p->local.addr = reinterpret_cast<uint64_t>(p->recvRing.get());
    p->local.slots = slots;
    p->local.slotBytes = options_.slotBytes;
    for (int i = 0; i < recvDepth; ++i) ops_->postRecv(r, kRecvWr | static_cast<uint64_t>(i));
    p->credits = slots;
    p->slotBusy.assign(slots, false);
    p->slotOwner.resize(slots);
    keys.push_back(detail::str(options_.keyPrefix, "/qp/", rank_, "/", r));
    values.push_back(serializeQpInfo(p->local));
    peers_[r] = std::move(p);
  }
  if (!keys.empty()) {
    std::vector<Bytes> bytes;
    for (auto& v : values) bytes.push_back(toBytes(v));
    store.multiSet(keys, bytes);
  }

  auto waitAll = [&](const std::vector<std::string>& want, const std::vector<int>& ranks,
                     const char* what) {
    try {
      waitWatchingSetup(store, want, Deadline(options_.timeout), failedKey,
                        detail::str("rank ", rank_, ": verbs setup stopped"));
    } catch (const TimeoutError&) {
      std::string missing;
      for (size_t i = 0; i < want.size(); ++i) {
        if (!store.check({want[i]}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(ranks[i]);
      }
      LOOM_THROW(TimeoutError, "rank ", rank_, ": verbs setup: ranks ", missing,
                 " never published their ", what, " within ", options_.timeout.count(),
                 " ms (keys under ", options_.keyPrefix, ")");
    }
  };
  std::vector<std::string> want;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    want.push_back(detail::str(options_.keyPrefix, "/qp/", r, "/", rank_));
    ranks.push_back(r);
  }
  waitAll(want, ranks, "queue-pair info");
  for (size_t i = 0; i < want.size(); ++i) {
    VerbsPeer& p = *peers_[ranks[i]];
    p.remote = parseQpInfo(store.getString(want[i]), want[i]);
    if (p.remote.slots != options_.slots || p.remote.slotBytes != options_.slotBytes) {
      LOOM_THROW(InvalidArgumentError, "rank ", rank_, ": rank ", p.rank, " uses ", p.remote.slots,
                 " slots of ", p.remote.slotBytes, " bytes, this rank ", options_.slots, " of ",
                 options_.slotBytes,
                 " (LOOM_IB_SLOTS / LOOM_IB_SLOT_BYTES must be equal on "
                 "every rank)");
    }
    p.addr = detail::str("lid ", p.remote.lid, " qpn ", p.remote.qpn);
    ops_->connectQp(p.rank, p.local, p.remote);
  }
  store.set(detail::str(options_.keyPrefix, "/ready/", rank_), std::string("1"));
  std::vector<std::string> ready;
  for (int r : ranks) ready.push_back(detail::str(options_.keyPrefix, "/ready/", r));
  if (!ready.empty()) waitAll(ready, ranks, "ready mark");
}

VerbsTransport::~VerbsTransport() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_.load()) {
      for (auto& pp : peers_) {
        if (pp && !pp->goodbye) postCtrlLocked(*pp, ImmKind::kGoodbye, 0);
      }
      // Let the goodbyes leave before the queue pairs go (bounded: a dead peer fails them).
      const auto end = Clock::now() + std::chrono::seconds(2);
      cv_.wait_until(lock, end, [&] {
        if (failed_.load()) return true;
        for (auto& pp : peers_) {
          if (pp && pp->ctrlInFlight > 0) return false;
        }
        return true;
      });
    }
  }
  stop_.store(true);
  ops_->wake();
  if (progress_.joinable()) progress_.join();
  for (auto& [addr, mr] : registered_) ops_->deregMr(mr);
  for (auto& pp : peers_) {
    if (!pp) continue;
    ops_->deregMr(pp->recvMr);
    ops_->deregMr(pp->sendMr);
  }
  ops_.reset();
}

void VerbsTransport::checkPeer(int peer) const {
  LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, "rank ", rank_, ": peer ", peer,
             " is not another rank of this world of size ", size_);
}

std::shared_ptr<VerbsRequest> VerbsTransport::makeRequest(int peer, bool send, const void* data,
                                                          size_t bytes, uint64_t tag) {
  return std::make_shared<VerbsRequest>(this, peer, send, data, bytes, tag);
}

const MemoryRegion* VerbsTransport::findRegisteredLocked(const void* data, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(data);
  auto it = registered_.upper_bound(a);
  if (it == registered_.begin()) return nullptr;
  --it;
  if (a + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

RegisteredBuffer VerbsTransport::registerBuffer(const void* data, size_t bytes) {
  RegisteredBuffer handle{const_cast<void*>(data), bytes, 0};
  if (data == nullptr || bytes == 0) return handle;
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<uintptr_t>(data);
  auto it = registered_.find(a);
  if (it != registered_.end()) {
    if (it->second.bytes >= bytes) {
      handle.rkey = it->second.rkey;
      return handle;
    }
    ops_->deregMr(it->second);
    registered_.erase(it);
  }
  // Registration is an optimisation: when it fails (read-only pages, memlock limit), sends
  // from this buffer go through the staging ring.
  try {
    const MemoryRegion& mr = registered_[a] = ops_->regMr(const_cast<void*>(data), bytes);
    handle.rkey = mr.rkey;
  } catch (const std::exception& e) {
    registered_.erase(a);
    LOOM_LOG_WARNING("rank ", rank_, ": registering ", bytes,
                     " bytes for zero-copy sends failed (sends from it are copied): ", e.what());
  }
  return handle;
}

void VerbsTransport::unregisterBuffer(const RegisteredBuffer& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = registered_.find(reinterpret_cast<uintptr_t>(buffer.data));
  if (it == registered_.end()) return;
  // A zero-copy fragment still reading it keeps the request pending; the caller's contract
  // is to unregister only after its requests completed.
  ops_->deregMr(it->second);
  registered_.erase(it);
}

size_t VerbsTransport::registeredRegions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registered_.size();
}

uint64_t VerbsTransport::zeroCopySends() const {
  std::lock_guard<std::mutex> lock(mu_);
  return zeroCopySends_;
}

RequestPtr VerbsTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  auto req = makeRequest(peer, true, data, bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) {
    req->fail(failure_);
    return req;
  }
  VerbsPeer& p = *peers_[peer];
  if (p.goodbye) {
    req->fail(detail::str("rank ", rank_, ": cannot send ", describeTag(tag), " to rank ", peer,
                          ": it closed its connection (its context was destroyed)"));
    return req;
  }
  req->mr_ = bytes > 0 ? findRegisteredLocked(data, bytes) : nullptr;
  p.sendQueue.push_back(req);
  pumpLocked(p);
  return req;
}

RequestPtr VerbsTransport::irecv(int peer, void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  std::shared_ptr<RequestCore> req = makeRequest(peer, false, data, bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) {
    req->fail(failure_);
    return req;
  }
  VerbsPeer& p = *peers_[peer];
  std::string error;
  switch (p.matcher.receive(req, error)) {
    case TagMatcher::Match::kDone:
    case TagMatcher::Match::kArriving:
      return req;
    case TagMatcher::Match::kError:
      break;
    case TagMatcher::Match::kNone:
      if (!p.goodbye) {
        p.matcher.post(req);
        return req;
      }
      error = detail::str("rank ", peer, " (", p.addr, ") closed its connection before sending ",
                          describeTag(tag));
      break;
  }
  failLocked(error, true);
  req->fail(error);
  return req;
}

void VerbsTransport::pumpLocked(VerbsPeer& p) {
  const uint32_t slots = options_.slots;
  while (!failed_.load() && !p.sendQueue.empty() && p.credits > 0 && !p.slotBusy[p.nextSendSlot]) {
    auto& req = p.sendQueue.front();
    const uint32_t slot = p.nextSendSlot;
    const size_t frag = std::min(req->bytes() - req->offset_, payloadPerSlot_);
    uint8_t* base = p.sendRing.get() + size_t{slot} * options_.slotBytes;
    SlotHeader h{req->tag(),
                 req->bytes(),
                 req->offset_,
                 req->signature().word,
                 req->signature().extra,
                 static_cast<uint32_t>(frag),
                 kSlotMagic};
    std::memcpy(base, &h, sizeof(h));
    std::vector<Sge> sges;
    const bool zeroCopy = req->mr_ != nullptr && frag > 0;
    if (zeroCopy) {
      sges.push_back({base, sizeof(h), p.sendMr.lkey});
      sges.push_back({req->data() + req->offset_, frag, req->mr_->lkey});
    } else {
      if (frag > 0) std::memcpy(base + sizeof(h), req->data() + req->offset_, frag);
      sges.push_back({base, sizeof(h) + frag, p.sendMr.lkey});
    }
    const uint64_t raddr = p.remote.addr + uint64_t{slot} * p.remote.slotBytes;
    try {
      ops_->postWriteImm(p.rank, slot, sges, raddr, p.remote.rkey, encodeImm(ImmKind::kData, slot));
    } catch (const std::exception& e) {
      failLocked(detail::str("rank ", rank_, ": posting an RDMA write of ", describeTag(req->tag()),
                             " to rank ", p.rank, " failed: ", e.what()),
                 true);
      return;
    }
    --p.credits;
    p.slotBusy[slot] = true;
    p.nextSendSlot = (slot + 1) % slots;
    if (zeroCopy) {
      ++req->fragsInFlight_;
      p.slotOwner[slot] = req;
      ++zeroCopySends_;
    }
    req->offset_ += frag;
    if (!zeroCopy) req->setBytesDone(req->offset_);
    if (req->offset_ == req->bytes()) {
      req->allPosted_ = true;
      if (req->fragsInFlight_ == 0) req->complete();
      p.sendQueue.pop_front();
    }
  }
}

void VerbsTransport::postAbortLocked(VerbsPeer& p, const std::string& reason) {
  // The text goes from this rank's abort area to the peer's, then the immediate says how long
  // it is (RC: the write lands before its immediate completes at the peer).
  const size_t n = std::min<size_t>(reason.size(), kAbortTextBytes);
  const size_t ringBytes = size_t{options_.slots} * options_.slotBytes;
  uint8_t* text = p.sendRing.get() + ringBytes;
  std::memcpy(text, reason.data(), n);
  std::vector<Sge> sges;
  if (n > 0) sges.push_back({text, n, p.sendMr.lkey});
  const uint64_t raddr = p.remote.addr + uint64_t{p.remote.slots} * p.remote.slotBytes;
  try {
    ops_->postWriteImm(p.rank, kCtrlWr, sges, raddr, p.remote.rkey,
                       encodeImm(ImmKind::kAbort, static_cast<uint32_t>(n)));
    ++p.ctrlInFlight;
  } catch (const std::exception&) {
    // Best effort: the peer then fails on its own deadline or its next write.
  }
}

void VerbsTransport::postCtrlLocked(VerbsPeer& p, ImmKind kind, uint32_t arg) {
  try {
    ops_->postWriteImm(p.rank, kCtrlWr, {}, 0, p.remote.rkey, encodeImm(kind, arg));
    ++p.ctrlInFlight;
  } catch (const std::exception& e) {
    if (kind == ImmKind::kCredit) {
      failLocked(detail::str("rank ", rank_, ": returning credits to rank ", p.rank,
                             " failed: ", e.what()),
                 true);
    }
    // goodbye / abort are best effort.
  }
}

void VerbsTransport::returnCreditsLocked(VerbsPeer& p) {
  if (p.freed >= creditThreshold(options_.slots) && p.ctrlInFlight < kMaxCtrlInFlight &&
      !p.goodbye && !failed_.load()) {
    const uint32_t n = p.freed;
    p.freed = 0;
    postCtrlLocked(p, ImmKind::kCredit, n);
  }
}

void VerbsTransport::onDataLocked(VerbsPeer& p, uint32_t slot) {
  auto corrupt = [&](const std::string& what) {
    failLocked(detail::str("rank ", rank_, ": corrupt fragment from rank ", p.rank, " (", p.addr,
                           ") in slot ", slot, ": ", what),
               true);
  };
  if (slot >= options_.slots) return corrupt("slot out of range");
  const uint8_t* base = p.recvRing.get() + size_t{slot} * options_.slotBytes;
  SlotHeader h;
  std::memcpy(&h, base, sizeof(h));
  if (h.magic != kSlotMagic || h.fragBytes > payloadPerSlot_ || h.offset > h.totalBytes ||
      h.fragBytes > h.totalBytes - h.offset) {
    return corrupt(detail::str("bad header (magic 0x", std::hex, h.magic, std::dec, ", offset ",
                               h.offset, ", fragment ", h.fragBytes, ", total ", h.totalBytes,
                               ")"));
  }
  TagMatcher::Incoming& in = p.matcher.incoming();
  if (h.offset == 0) {
    if (in.active) return corrupt("a new message starts inside another");
    std::string error;
    if (!p.matcher.arrive(h.tag, h.totalBytes, Signature{h.signature, h.signatureExtra}, error)) {
      if (!error.empty()) {
        failLocked(error, true);
        return;
      }
      if (!p.matcher.bufferIncoming(error)) {
        failLocked(error, true);
        return;
      }
    }
  } else if (!in.active) {
    return corrupt("a continuation fragment without a message");
  }
  if (h.tag != in.tag || h.totalBytes != in.bytes || h.offset != in.got ||
      Signature{h.signature, h.signatureExtra} != in.signature) {
    return corrupt("fragment of another message");
  }
  if (h.fragBytes > 0) std::memcpy(in.target + h.offset, base + sizeof(h), h.fragBytes);
  p.matcher.arrived(h.fragBytes);
  if (in.got == in.bytes) p.matcher.finishIncoming();
  ++p.freed;
  returnCreditsLocked(p);
}

void VerbsTransport::onCompletionLocked(const Completion& c) {
  if (c.peer < 0 || c.peer >= size_ || !peers_[c.peer]) return;
  VerbsPeer& p = *peers_[c.peer];
  if (!c.ok) {
    if (failed_.load() || stop_.load()) return;  // flushed work after a failure / shutdown
    if (c.op == Completion::kSend && c.wrId == kCtrlWr) --p.ctrlInFlight;
    // A credit return racing with the peer's goodbye: the peer is gone on purpose.
    if (p.goodbye && c.op == Completion::kSend && c.wrId == kCtrlWr) return;
    failLocked(detail::str("rank ", rank_, ": RDMA ",
                           c.op == Completion::kSend ? "write to" : "receive from", " rank ",
                           p.rank, " (", p.addr, ") failed: ", c.error,
                           " (the peer process exited, crashed or aborted, or the link is down)"),
               true);
    return;
  }
  if (c.op == Completion::kSend) {
    if (c.wrId == kCtrlWr) {
      --p.ctrlInFlight;
      returnCreditsLocked(p);
      cv_.notify_all();  // the destructor waits for goodbyes
      return;
    }
    const auto slot = static_cast<uint32_t>(c.wrId);
    if (slot >= options_.slots) return;
    p.slotBusy[slot] = false;
    if (auto owner = std::move(p.slotOwner[slot])) {
      --owner->fragsInFlight_;
      owner->setBytesDone(std::min(owner->bytes(), owner->bytesDone() + payloadPerSlot_));
      if (owner->allPosted_ && owner->fragsInFlight_ == 0) owner->complete();
    }
    pumpLocked(p);
    return;
  }
  // A receive: repost it first, so the peer never finds none posted.
  if (failed_.load()) return;
  try {
    ops_->postRecv(p.rank, c.wrId);
  } catch (const std::exception& e) {
    failLocked(detail::str("rank ", rank_, ": reposting a receive for rank ", p.rank,
                           " failed: ", e.what()),
               true);
    return;
  }
  switch (immKind(c.imm)) {
    case ImmKind::kData:
      onDataLocked(p, immArg(c.imm));
      break;
    case ImmKind::kCredit:
      p.credits += immArg(c.imm);
      if (p.credits > options_.slots) {
        failLocked(detail::str("rank ", rank_, ": rank ", p.rank, " returned more credits (",
                               p.credits, ") than slots (", options_.slots, ")"),
                   true);
        return;
      }
      pumpLocked(p);
      break;
    case ImmKind::kGoodbye:
      p.goodbye = true;
      if (p.matcher.waiting()) {
        failLocked(detail::str("rank ", p.rank, " (", p.addr, ") closed its connection while rank ",
                               rank_, " still waits for ", describeTag(p.matcher.waitingTag())),
                   true);
      }
      break;
    case ImmKind::kAbort: {
      // The peer's reason, when it wrote one into this ring's abort area (verbs_ops.h).
      const uint32_t n = immArg(c.imm);
      const size_t ringBytes = size_t{options_.slots} * options_.slotBytes;
      if (n > kAbortTextBytes) {
        failLocked(detail::str("rank ", rank_, ": corrupt abort from rank ", p.rank, ": ", n,
                               " bytes of text, at most ", kAbortTextBytes, " expected"),
                   false);
        break;
      }
      const std::string text(reinterpret_cast<const char*>(p.recvRing.get() + ringBytes), n);
      failLocked(n == 0 ? detail::str("rank ", p.rank, " aborted")
                        : detail::str("rank ", p.rank, " aborted: ", text),
                 false);
      break;
    }
    default:
      failLocked(detail::str("rank ", rank_, ": unknown immediate 0x", std::hex, c.imm,
                             " from rank ", std::dec, p.rank),
                 true);
  }
}

void VerbsTransport::progressLoop() {
  Completion batch[32];
  while (!stop_.load()) {
    const int n = ops_->pollCq(batch, 32);
    if (n == 0) {
      ops_->waitCq(std::chrono::milliseconds(100));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < n; ++i) onCompletionLocked(batch[i]);
  }
}

void VerbsTransport::failLocked(const std::string& reason, bool notifyPeers) {
  if (failed_.load()) return;
  failure_ = reason;
  failed_.store(true, std::memory_order_release);
  LOOM_LOG_INFO("verbs transport of rank ", rank_, " failed: ", reason);
  for (auto& pp : peers_) {
    if (!pp) continue;
    VerbsPeer& p = *pp;
    p.matcher.failAll(reason);
    for (auto& r : p.sendQueue) r->fail(reason);
    p.sendQueue.clear();
    for (auto& r : p.slotOwner) {
      if (r) r->fail(reason);
      r.reset();
    }
    if (notifyPeers && !p.goodbye) postAbortLocked(p, reason);
  }
  cv_.notify_all();
}

void VerbsTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  failLocked(reason, true);
}

std::string VerbsTransport::peerAddress(int peer) const {
  if (peer < 0 || peer >= size_ || !peers_[peer]) return "?";
  return detail::str(ops_->describe(), " ", peers_[peer]->addr);
}

std::string VerbsTransport::describeUnexpected(int peer) const {
  if (peer < 0 || peer >= size_ || !peers_[peer]) return {};
  std::lock_guard<std::mutex> lock(mu_);
  return peers_[peer]->matcher.describeUnexpected();
}

bool VerbsTransport::probe(int peer, uint64_t tag) const {
  if (peer < 0 || peer >= size_ || !peers_[peer]) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return peers_[peer]->matcher.hasUnexpected(tag);
}

}  // namespace loom::comm::verbs
