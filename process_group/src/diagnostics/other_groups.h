// What this process does in its other groups, for a dump (RankDump::otherGroups): a rank that
// never enters a collective of one group because it is blocked in a collective of another is
// told apart from one that is idle (docs/diagnostics.md, "Hangs across groups").
// Private to loom_process_group.
//
// Contract
// - Off the hot path: called when a dump is taken (a request, SIGUSR1, a failure), on the
//   dumping thread. It reads the other groups' recorders as any dump does (readers never block
//   their writers) and takes the registry's lock only to copy the list of live groups.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "diagnostics/group_diagnostics_core.h"
#include "loom/process_group/diagnostics.h"

namespace loom::diag {

// Every live group of this process that has a flight recorder (the registry SIGUSR1 dumps),
// in the order they were created. group_diagnostics.cc.
std::vector<std::shared_ptr<GroupDiagnostics::Core>> liveGroups();

// How many of another group's newest entries a dump reads to find what it is doing.
inline constexpr size_t kOtherGroupEntries = 64;

// For `self`'s dump: every group of `live` but `self`, with its oldest unfinished collective
// (the one the process is blocked in or running there), else its oldest unfinished operation,
// else its newest one (idle since), among its newest kOtherGroupEntries entries; times on
// `self`'s clock (its test-only skew added). A group of which the process holds several ranks
// (ranks as threads, in tests) is left out, and when it is `self`'s, all are: the process is
// then not one rank.
std::vector<OtherGroup> otherGroups(
    const GroupDiagnostics::Core& self,
    const std::vector<std::shared_ptr<GroupDiagnostics::Core>>& live);

}  // namespace loom::diag
