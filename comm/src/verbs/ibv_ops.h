// IbvOps: VerbsOps over libibverbs: one device context, protection domain, completion
// channel and completion queue per transport, one RC queue pair per peer. NEVER RUN ON
// HARDWARE in this repository's CI (no RDMA device there); see docs/verbs.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "verbs/verbs_ops.h"

namespace loom::comm::verbs {

// Names of the RDMA devices visible now (ibv_get_device_list); empty when none.
std::vector<std::string> listDevices();

// Opens the device picked by config (selectDevice), checks the port is active and the gid
// index valid. Throws NotAvailableError when there is no device, InvalidArgumentError for a
// bad LOOM_IB_DEVICE / LOOM_IB_PORT / LOOM_IB_GID_INDEX, IoError when a verbs call fails.
std::unique_ptr<VerbsOps> openIbvOps(const VerbsConfig& config, int worldSize);

}  // namespace loom::comm::verbs
