// Hierarchy: how the ranks of a Context spread over hosts, for the hierarchical all-reduce
// when hosts hold several ranks each but not all ranks share one host.
//
// How the hierarchical all-reduce works: the ranks of each host reduce into their host's
// leader (its lowest rank) through the host's shared-memory arena (shm::reduce, the split
// path); the leaders all-reduce among themselves over the tcp transport (every leader sends
// its host's partial result to every other leader and reduces the H partials in leader order,
// so all leaders compute the same bits; one round, fine for the few hosts of a job); then each
// leader broadcasts the result within its host through the arena. A host with one rank skips
// the shared-memory steps. avg is a sum everywhere and one division at the end.
//
// The other collectives run the generic algorithms over the Context's transport in a
// multi-host Context (same-host pairs through the shared-memory transport, the others tcp).
#pragma once

#include <cstddef>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"

namespace loom::comm {
class Context;
}

namespace loom::comm::shm {

class Arena;

struct Hierarchy {
  std::vector<int> leaders;  // lowest rank of each host, in increasing order
  int leaderIndex = -1;      // this rank's index in `leaders` when it leads its host, else -1
  Arena* arena = nullptr;    // this host's arena (null when the host has one rank)
};

// The Context's hierarchy (its hierarchical engine's) when it spans several hosts and at least
// one host holds several ranks with shared memory on; null otherwise (single host: arenaOf; or
// no shm at all). For tests and diagnostics.
const Hierarchy* hierarchyOf(Context& ctx);

void hierarchicalAllreduce(Context& ctx, const Hierarchy& hierarchy, const CollectiveOptions& opts,
                           const void* in, void* out, size_t count, DType dtype, ReduceOp op);

}  // namespace loom::comm::shm
