// The RC queue pair state machine as pure functions: the attributes and attribute masks of
// the RESET -> INIT -> RTR -> RTS transitions, computed from the local port and the peer's
// published QpInfo. IbvOps::connectQp feeds them to ibv_modify_qp; tests check them without
// a device.
#pragma once

#include <infiniband/verbs.h>

#include "verbs/verbs_ops.h"

namespace loom::comm::verbs {

struct QpTransition {
  ibv_qp_attr attr;
  int mask;
};

struct LocalPort {
  uint8_t port = 1;
  int gidIndex = 0;
  uint32_t activeMtu = IBV_MTU_1024;  // ibv_mtu of the port
  bool ethernet = false;              // RoCE: addressing by GID only
};

QpTransition qpToInit(const LocalPort& port);
// Path MTU = min(local, remote); global routing header when the link is Ethernet or the peer
// published a GID (throws InvalidArgumentError when RoCE and the peer's GID is zero).
QpTransition qpToRtr(const LocalPort& port, const QpInfo& remote);
QpTransition qpToRts(const QpInfo& local);

}  // namespace loom::comm::verbs
