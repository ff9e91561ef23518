// FakeOps: VerbsOps over an in-memory "fabric" shared by the ranks (threads) of one test
// process, so that the verbs transport's protocol runs end to end without an RDMA device.
//
// It models what the protocol relies on: memory registration with keys (a write outside a
// registered region or with a wrong rkey fails with "remote access error"), queue pairs that
// must be connected to the peer's published qpn, RC ordering (a write lands and its
// immediate completes at the receiver in posting order), a receive work request consumed per
// write with immediate (none posted: "RNR retry counter exceeded"), signaled send
// completions, and a peer that is gone or a link that was cut (writes fail with "transport
// retry counter exceeded", as RC does after its retries).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "verbs/verbs_ops.h"

namespace loom::comm::verbs {

class FakeFabric {
 public:
  // Cut the link between a and b: later writes either way fail.
  void cutLink(int a, int b);
  // Counters for tests.
  uint64_t writes() const;
  uint64_t maxOutstandingRecvs() const;

 private:
  friend class FakeOps;
  struct Endpoint {
    std::map<uint64_t, std::pair<size_t, uint32_t>> mrs;  // addr -> (bytes, rkey)
    std::map<int, uint32_t> qpn;                          // peer -> my qpn
    std::map<int, uint32_t> connectedTo;                  // peer -> its qpn
    std::map<int, std::deque<uint64_t>> recvs;            // peer -> posted recv wr ids
    std::deque<Completion> cq;
    std::condition_variable cv;
    bool woken = false;
  };
  mutable std::mutex mu_;
  std::map<int, Endpoint*> endpoints_;
  std::set<std::pair<int, int>> cut_;
  uint32_t nextKey_ = 1;
  uint32_t nextQpn_ = 0x100;
  uint64_t writes_ = 0;
  uint64_t maxRecvs_ = 0;
};

class FakeOps : public VerbsOps {
 public:
  FakeOps(std::shared_ptr<FakeFabric> fabric, int rank);
  ~FakeOps() override;

  std::string describe() const override { return "fake fabric"; }
  MemoryRegion regMr(void* addr, size_t bytes) override;
  void deregMr(const MemoryRegion& mr) override;
  QpInfo createQp(int peer, int sendDepth, int recvDepth) override;
  void connectQp(int peer, const QpInfo& local, const QpInfo& remote) override;
  void postRecv(int peer, uint64_t wrId) override;
  void postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                    uint32_t rkey, uint32_t imm) override;
  int pollCq(Completion* out, int max) override;
  void waitCq(std::chrono::milliseconds timeout) override;
  void wake() override;

 private:
  std::shared_ptr<FakeFabric> fabric_;
  const int rank_;
  FakeFabric::Endpoint ep_;
};

}  // namespace loom::comm::verbs
