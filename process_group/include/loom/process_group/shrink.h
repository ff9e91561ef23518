// shrinkGroup: after a peer failure, the surviving ranks agree on who is still there and get a
// new, smaller group from the old one, without restarting (the semantics of NCCL's
// ncclCommShrink, over the old group's store).
//
// Contract
// - Collective over the survivors: every rank of `group` that is still alive calls
//   shrinkGroup(group, options), typically after an operation failed with IoError. The old
//   group is not used (it may be broken or healthy); destroy it afterwards.
// - Agreement, in bounded time: each caller announces itself under the old group's store
//   ("shrink/<n>/alive/<rank>"), then waits until every rank not in options.excludeRanks has
//   announced itself, or options.joinWindow has passed. The first caller to get there proposes
//   the ranks announced at that moment with compareSet on "shrink/<n>/members"; the first
//   proposal stands and every caller reads that one. So every survivor gets the same member
//   set; a rank that announces itself after the decision is excluded and its call throws
//   IoError saying so (it is never half-included). Ranks in excludeRanks are never admitted.
// - The new group: the members in old-rank order, rank = position, size = member count, the
//   old group's backend and options (groupName "<old name>/shrink<n>", parentRanks = the
//   members' old ranks), its keys under "shrink/<n>/group/" of the old store: a fresh
//   namespace per shrink, so the old group's and the new group's keys never mix. Blocks until
//   the members are connected (the old options' timeout); a member that dies meanwhile makes
//   createProcessGroup fail with TimeoutError naming it, and the survivors may shrink again.
// - <n> counts this process's shrinkGroup calls on `group` (1, 2, ...): every survivor must
//   make the same calls in the same order, as with newGroup.
// - Fewer members than options.minSize: IoError on every caller, naming the members.
// - The store must outlive the failure: a FileStore, a standalone loom-store (docs/store.md),
//   or a TCPStore hosted by a rank that is not the one that died.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "loom/process_group/process_group.h"

namespace loom {

struct ShrinkOptions {
  // Ranks of the old group known to be gone: not waited for, never admitted.
  std::vector<int> excludeRanks{};
  // How long the survivors wait for each other before deciding without the missing ranks.
  std::chrono::milliseconds joinWindow{10000};
  // The smallest group that may come out of the shrink.
  int minSize = 1;
};

std::shared_ptr<ProcessGroup> shrinkGroup(ProcessGroup& group, const ShrinkOptions& options = {});

}  // namespace loom
