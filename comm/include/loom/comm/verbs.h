// The RDMA verbs transport, seen from outside comm/: a Context whose transport is verbs
// (libibverbs RC queue pairs, RDMA write with immediate; see docs/verbs.md).
//
// Contract
// - verbsAvailable(&why, options) is true when Loom was built with libibverbs and at least one
//   RDMA device is visible (options.device, or LOOM_IB_DEVICE, when set); otherwise false, with the
//   reason in *why ("built without verbs (LOOM_WITH_VERBS=OFF)", "no RDMA device found
//   (ibv_get_device_list returned 0 devices)", ...).
// - createVerbsContext is collective like Context::create: every rank calls it with the same
//   store, its rank and the size; the queue-pair info is exchanged under
//   "<options.storePrefix>/verbs/...". It throws NotAvailableError (with the reason above)
//   when verbs cannot be used, TimeoutError naming the ranks that never published their
//   queue-pair info, IoError when a verbs call fails (naming the call and the errno).
// - Settings: ContextOptions::verbs (VerbsOptions, loom/comm/context.h); fields left at their
//   defaults take LOOM_IB_DEVICE, LOOM_IB_PORT, LOOM_IB_GID_INDEX, LOOM_IB_SLOTS and
//   LOOM_IB_SLOT_BYTES when set, as every ContextOptions field takes its variable.
#pragma once

#include <memory>
#include <string>

#include "loom/comm/context.h"

namespace loom {
class Store;
}

namespace loom::comm {

bool verbsAvailable(std::string* why = nullptr, const VerbsOptions& options = {});

std::shared_ptr<Context> createVerbsContext(Store& store, int rank, int size,
                                            const ContextOptions& options = {});

}  // namespace loom::comm
