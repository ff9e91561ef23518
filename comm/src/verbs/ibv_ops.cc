#include "verbs/ibv_ops.h"

#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "loom/common/error.h"
#include "verbs/verbs_qp.h"

namespace loom::comm::verbs {

namespace {

[[noreturn]] void throwVerbs(const char* call, int err, const std::string& device) {
  LOOM_THROW(IoError, call, " on ", device, " failed: ", detail::errnoText(err));
}

class IbvOps : public VerbsOps {
 public:
  IbvOps(const VerbsConfig& config, int worldSize) : config_(config) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr) n = 0;
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) names.push_back(ibv_get_device_name(list[i]));
    size_t pick = 0;
    try {
      pick = selectDevice(names, config.device);
    } catch (...) {
      if (list != nullptr) ibv_free_device_list(list);
      throw;
    }
    name_ = names[pick];
    ctx_ = ibv_open_device(list[pick]);
    const int openErr = errno;
    ibv_free_device_list(list);
    if (ctx_ == nullptr) throwVerbs("ibv_open_device", openErr, name_);
    ibv_device_attr dev{};
    if (int rc = ibv_query_device(ctx_, &dev); rc != 0) cleanupAndThrow("ibv_query_device", rc);
    ibv_port_attr port{};
    if (config.port >= 1 && config.port <= dev.phys_port_cnt) {
      if (int rc = ibv_query_port(ctx_, static_cast<uint8_t>(config.port), &port); rc != 0) {
        cleanupAndThrow("ibv_query_port", rc);
      }
    }
    try {
      checkPortAndGid(name_, config.port, dev.phys_port_cnt, config.gidIndex, port.gid_tbl_len);
    } catch (...) {
      cleanup();
      throw;
    }
    if (port.state != IBV_PORT_ACTIVE) {
      cleanup();
      LOOM_THROW(NotAvailableError, name_, " port ", config.port, " is not active (state ",
                 ibv_port_state_str(port.state), ")");
    }
    local_.port = static_cast<uint8_t>(config.port);
    local_.gidIndex = config.gidIndex;
    local_.activeMtu = port.active_mtu;
    local_.ethernet = port.link_layer == IBV_LINK_LAYER_ETHERNET;
    lid_ = port.lid;
    if (int rc = ibv_query_gid(ctx_, local_.port, config.gidIndex, &gid_); rc != 0) {
      cleanupAndThrow("ibv_query_gid", rc);
    }
    pd_ = ibv_alloc_pd(ctx_);
    if (pd_ == nullptr) cleanupAndThrow("ibv_alloc_pd", errno);
    channel_ = ibv_create_comp_channel(ctx_);
    if (channel_ == nullptr) cleanupAndThrow("ibv_create_comp_channel", errno);
    const int cqe = std::max(64, worldSize * 2 * (static_cast<int>(config.slots) + 16));
    cq_ = ibv_create_cq(ctx_, std::min(cqe, dev.max_cqe), nullptr, channel_, 0);
    if (cq_ == nullptr) cleanupAndThrow("ibv_create_cq", errno);
    if (int rc = ibv_req_notify_cq(cq_, 0); rc != 0) cleanupAndThrow("ibv_req_notify_cq", rc);
    wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakeFd_ < 0) cleanupAndThrow("eventfd", errno);
  }

  ~IbvOps() override { cleanup(); }

  std::string describe() const override { return detail::str(name_, " port ", config_.port); }

  MemoryRegion regMr(void* addr, size_t bytes) override {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr) throwVerbs("ibv_reg_mr", errno, name_);
    return MemoryRegion{addr, bytes, mr->lkey, mr->rkey, mr};
  }
  void deregMr(const MemoryRegion& mr) override {
    if (mr.handle != nullptr) ibv_dereg_mr(static_cast<ibv_mr*>(mr.handle));
  }

  QpInfo createQp(int peer, int sendDepth, int recvDepth) override {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = static_cast<uint32_t>(sendDepth);
    init.cap.max_recv_wr = static_cast<uint32_t>(recvDepth);
    init.cap.max_send_sge = 2;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (qp == nullptr) throwVerbs("ibv_create_qp", errno, name_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      qps_[peer] = qp;
      peerOfQpn_[qp->qp_num] = peer;
    }
    QpTransition t = qpToInit(local_);
    if (int rc = ibv_modify_qp(qp, &t.attr, t.mask); rc != 0) {
      throwVerbs("ibv_modify_qp(INIT)", rc, name_);
    }
    QpInfo info;
    info.lid = lid_;
    std::memcpy(info.gid, gid_.raw, 16);
    info.qpn = qp->qp_num;
    std::random_device rd;
    info.psn = rd() & 0xffffff;
    info.mtu = local_.activeMtu;
    return info;
  }

  void connectQp(int peer, const QpInfo& local, const QpInfo& remote) override {
    ibv_qp* qp = qpFor(peer);
    QpTransition rtr = qpToRtr(local_, remote);
    if (int rc = ibv_modify_qp(qp, &rtr.attr, rtr.mask); rc != 0) {
      throwVerbs("ibv_modify_qp(RTR)", rc, name_);
    }
    QpTransition rts = qpToRts(local);
    if (int rc = ibv_modify_qp(qp, &rts.attr, rts.mask); rc != 0) {
      throwVerbs("ibv_modify_qp(RTS)", rc, name_);
    }
  }

  void postRecv(int peer, uint64_t wrId) override {
    ibv_recv_wr wr{};
    wr.wr_id = wrId;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qpFor(peer), &wr, &bad); rc != 0) {
      throwVerbs("ibv_post_recv", rc, name_);
    }
  }

  void postWriteImm(int peer, uint64_t wrId, const std::vector<Sge>& sges, uint64_t raddr,
                    uint32_t rkey, uint32_t imm) override {
    ibv_sge sg[2];
    LOOM_CHECK(sges.size() <= 2, "at most 2 scatter-gather entries, got ", sges.size());
    for (size_t i = 0; i < sges.size(); ++i) {
      sg[i].addr = reinterpret_cast<uint64_t>(sges[i].addr);
      sg[i].length = static_cast<uint32_t>(sges[i].bytes);
      sg[i].lkey = sges[i].lkey;
    }
    ibv_send_wr wr{};
    wr.wr_id = wrId;
    wr.sg_list = sges.empty() ? nullptr : sg;
    wr.num_sge = static_cast<int>(sges.size());
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qpFor(peer), &wr, &bad); rc != 0) {
      throwVerbs("ibv_post_send", rc, name_);
    }
  }

  int pollCq(Completion* out, int max) override {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, std::min(max, 32), wc);
    if (n < 0) {
      out[0] = Completion{};
      out[0].ok = false;
      out[0].error = "ibv_poll_cq failed";
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      Completion& c = out[i];
      c = Completion{};
      c.wrId = wc[i].wr_id;
      c.ok = wc[i].status == IBV_WC_SUCCESS;
      if (!c.ok) c.error = ibv_wc_status_str(wc[i].status);
      // Error completions may not carry the opcode: tell sends from receives by wr id range
      // is not possible, so use the opcode when successful and kSend otherwise.
      c.op = (c.ok && (wc[i].opcode & IBV_WC_RECV)) ? Completion::kRecv : Completion::kSend;
      c.imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peerOfQpn_.find(wc[i].qp_num);
      c.peer = it == peerOfQpn_.end() ? -1 : it->second;
    }
    return n;
  }

  void waitCq(std::chrono::milliseconds timeout) override {
    pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {wakeFd_, POLLIN, 0}};
    const int rc = ::poll(fds, 2, static_cast<int>(timeout.count()));
    if (rc <= 0) return;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wakeFd_, &v, sizeof(v));
    }
    if (fds[0].revents & POLLIN) {
      ibv_cq* cq = nullptr;
      void* cqCtx = nullptr;
      if (ibv_get_cq_event(channel_, &cq, &cqCtx) == 0) {
        ibv_ack_cq_events(cq, 1);
        ibv_req_notify_cq(cq, 0);
      }
    }
  }

  void wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  }

 private:
  ibv_qp* qpFor(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = qps_.find(peer);
    LOOM_CHECK(it != qps_.end(), "no queue pair to rank ", peer);
    return it->second;
  }
  [[noreturn]] void cleanupAndThrow(const char* call, int err) {
    cleanup();
    throwVerbs(call, err, name_);
  }
  void cleanup() {
    for (auto& [peer, qp] : qps_) ibv_destroy_qp(qp);
    qps_.clear();
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    cq_ = nullptr;
    if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
    channel_ = nullptr;
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    pd_ = nullptr;
    if (ctx_ != nullptr) ibv_close_device(ctx_);
    ctx_ = nullptr;
    if (wakeFd_ >= 0) ::close(wakeFd_);
    wakeFd_ = -1;
  }

  const VerbsConfig config_;
  std::string name_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int wakeFd_ = -1;
  LocalPort local_;
  uint16_t lid_ = 0;
  ibv_gid gid_{};
  std::mutex mu_;
  std::map<int, ibv_qp*> qps_;
  std::map<uint32_t, int> peerOfQpn_;
};

}  // namespace

std::vector<std::string> listDevices() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  std::vector<std::string> names;
  if (list == nullptr) return names;
  for (int i = 0; i < n; ++i) names.push_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

std::unique_ptr<VerbsOps> openIbvOps(const VerbsConfig& config, int worldSize) {
  return std::make_unique<IbvOps>(config, worldSize);
}

}  // namespace loom::comm::verbs
