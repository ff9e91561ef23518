#include "verbs/fake_ops.h"

#include <algorithm>
#include <cstring>

#include "loom/common/error.h"

namespace loom::comm::verbs {

void FakeFabric::cutLink(int a, int b) {
  std::lock_guard<std::mutex> lock(mu_);
  cut_.insert({std::min(a, b), std::max(a, b)});
}

uint64_t FakeFabric::writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

uint64_t FakeFabric::maxOutstandingRecvs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return maxRecvs_;
}

FakeOps::FakeOps(std::shared_ptr<FakeFabric> fabric, int rank)
    : fabric_(std::move(fabric)), rank_(rank) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  LOOM_CHECK(fabric_->endpoints_.count(rank) == 0, "fake fabric: rank ", rank,
             " is already attached");
  fabric_->endpoints_[rank] = &ep_;
}

FakeOps::~FakeOps() {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  fabric_->endpoints_.erase(rank_);
}

MemoryRegion FakeOps::regMr(void* addr, size_t bytes) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  MemoryRegion mr;
  mr.addr = addr;
  mr.bytes = bytes;
  mr.lkey = mr.rkey = fabric_->nextKey_++;
  ep_.mrs[reinterpret_cast<uint64_t>(addr)] = {bytes, mr.rkey};
  return mr;
}

void FakeOps::deregMr(const MemoryRegion& mr) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  ep_.mrs.erase(reinterpret_cast<uint64_t>(mr.addr));
}

QpInfo FakeOps::createQp(int peer, int /*sendDepth*/, int /*recvDepth*/) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  QpInfo info;
  info.lid = static_cast<uint16_t>(rank_ + 1);
  info.qpn = fabric_->nextQpn_++;
  info.psn = (info.qpn * 2654435761u) & 0xffffff;
  info.mtu = 5;
  ep_.qpn[peer] = info.qpn;
  return info;
}

void FakeOps::connectQp(int peer, const QpInfo& /*local*/, const QpInfo& remote) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  auto it = fabric_->endpoints_.find(peer);
  if (it == fabric_->endpoints_.end() || it->second->qpn.count(rank_) == 0 ||
      it->second->qpn[rank_] != remote.qpn) {
    LOOM_THROW(IoError, "fake fabric: rank ", rank_, " cannot connect to qpn ", remote.qpn,
               " of rank ", peer, " (no such queue pair)");
  }
  ep_.connectedTo[peer] = remote.qpn;
}

void FakeOps::postRecv(int peer, uint64_t wrId) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  auto& q = ep_.recvs[peer];
  q.push_back(wrId);
  fabric_->maxRecvs_ = std::max<uint64_t>(fabric_->maxRecvs_, q.size());
}

void FakeOps::postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                           uint32_t rkey, uint32_t imm) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  ++fabric_->writes_;
  Completion done;
  done.op = Completion::kSend;
  done.peer = peer;
  done.wrId = wrId;
  auto fail = [&](const std::string& why) {
    done.ok = false;
    done.error = why;
    ep_.cq.push_back(done);
    ep_.cv.notify_all();
  };
  if (ep_.connectedTo.count(peer) == 0) {
    LOOM_THROW(IoError, "fake fabric: rank ", rank_, " posts to rank ", peer,
               " on a queue pair that is not connected");
  }
  auto it = fabric_->endpoints_.find(peer);
  if (it == fabric_->endpoints_.end() ||
      fabric_->cut_.count({std::min(rank_, peer), std::max(rank_, peer)}) != 0) {
    return fail("transport retry counter exceeded");
  }
  FakeFabric::Endpoint& remote = *it->second;
  size_t total = 0;
  for (const Sge& s : sges) total += s.bytes;
  if (total > 0) {
    auto mr = remote.mrs.upper_bound(raddr);
    if (mr == remote.mrs.begin()) return fail("remote access error");
    --mr;
    if (mr->second.second != rkey || raddr + total > mr->first + mr->second.first) {
      return fail("remote access error");
    }
  }
  auto& recvs = remote.recvs[rank_];
  if (recvs.empty()) return fail("RNR retry counter exceeded");
  auto* dst = reinterpret_cast<uint8_t*>(raddr);
  for (const Sge& s : sges) {
    std::memcpy(dst, s.addr, s.bytes);
    dst += s.bytes;
  }
  Completion in;
  in.op = Completion::kRecv;
  in.peer = rank_;
  in.wrId = recvs.front();
  in.imm = imm;
  recvs.pop_front();
  remote.cq.push_back(in);
  remote.cv.notify_all();
  ep_.cq.push_back(done);
  ep_.cv.notify_all();
}

int FakeOps::pollCq(Completion* out, int max) {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  int n = 0;
  while (n < max && !ep_.cq.empty()) {
    out[n++] = std::move(ep_.cq.front());
    ep_.cq.pop_front();
  }
  return n;
}

void FakeOps::waitCq(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(fabric_->mu_);
  ep_.cv.wait_for(lock, timeout, [&] { return !ep_.cq.empty() || ep_.woken; });
  ep_.woken = false;
}

void FakeOps::wake() {
  std::lock_guard<std::mutex> lock(fabric_->mu_);
  ep_.woken = true;
  ep_.cv.notify_all();
}

}  // namespace loom::comm::verbs
