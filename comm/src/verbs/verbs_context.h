// The verbs Context (transport + scratch memory), with the verbs ops injectable so that tests
// can run it over the fake fabric.
#pragma once

#include <memory>

#include "loom/comm/context.h"
#include "verbs/verbs_ops.h"

namespace loom::comm::verbs {

std::shared_ptr<Context> createContextWithOps(Store& store, int rank, int size,
                                              const ContextOptions& options,
                                              std::unique_ptr<VerbsOps> ops,
                                              const VerbsConfig& config);

}  // namespace loom::comm::verbs
