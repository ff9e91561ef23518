#include "verbs/verbs_qp.h"

#include <algorithm>
#include <cstring>

#include "loom/common/error.h"

namespace loom::comm::verbs {

QpTransition qpToInit(const LocalPort& port) {
  QpTransition t{};
  std::memset(&t.attr, 0, sizeof(t.attr));
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port.port;
  t.attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition qpToRtr(const LocalPort& port, const QpInfo& remote) {
  LOOM_CHECK(remote.mtu >= IBV_MTU_256 && remote.mtu <= IBV_MTU_4096, "peer's path MTU enum ",
             remote.mtu, " is not an ibv_mtu value (1..5)");
  QpTransition t{};
  std::memset(&t.attr, 0, sizeof(t.attr));
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = static_cast<ibv_mtu>(std::min(port.activeMtu, remote.mtu));
  t.attr.dest_qp_num = remote.qpn;
  t.attr.rq_psn = remote.psn;
  t.attr.max_dest_rd_atomic = 1;
  t.attr.min_rnr_timer = 12;  // 0.64 ms
  t.attr.ah_attr.port_num = port.port;
  t.attr.ah_attr.dlid = remote.lid;
  t.attr.ah_attr.sl = 0;
  t.attr.ah_attr.src_path_bits = 0;
  const bool haveGid = !gidIsZero(remote.gid);
  if (port.ethernet && !haveGid) {
    LOOM_THROW(InvalidArgumentError,
               "the link is Ethernet (RoCE) but the peer published a zero GID: set "
               "LOOM_IB_GID_INDEX to an index with a valid GID on every rank");
  }
  if (port.ethernet || haveGid) {
    t.attr.ah_attr.is_global = 1;
    std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid, 16);
    t.attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gidIndex);
    t.attr.ah_attr.grh.hop_limit = 64;
    t.attr.ah_attr.grh.flow_label = 0;
    t.attr.ah_attr.grh.traffic_class = 0;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition qpToRts(const QpInfo& local) {
  QpTransition t{};
  std::memset(&t.attr, 0, sizeof(t.attr));
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.sq_psn = local.psn;
  t.attr.timeout = 14;  // 4.096 us * 2^14 = 67 ms per retry
  t.attr.retry_cnt = 7;
  t.attr.rnr_retry = 7;  // infinite: a receive is always reposted, so RNR is transient
  t.attr.max_rd_atomic = 1;
  t.mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

}  // namespace loom::comm::verbs
