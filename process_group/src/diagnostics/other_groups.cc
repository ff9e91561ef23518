#include "diagnostics/other_groups.h"

#include <optional>
#include <utility>

namespace loom::diag {

namespace {

bool unfinished(const OpRecord& r) {
  return r.state == OpState::kQueued || r.state == OpState::kRunning;
}

// The operation that says what a group is doing (other_groups.h); nullopt when none was issued.
std::optional<OpRecord> currentOp(const std::vector<OpRecord>& entries) {
  const OpRecord* firstUnfinished = nullptr;
  for (const OpRecord& r : entries) {
    if (!unfinished(r)) continue;
    if (isCollective(r.type)) return r;  // collectives run in issue order: the blocking one
    if (firstUnfinished == nullptr) firstUnfinished = &r;
  }
  if (firstUnfinished != nullptr) return *firstUnfinished;
  if (entries.empty()) return std::nullopt;
  return entries.back();
}

}  // namespace

std::vector<OtherGroup> otherGroups(
    const GroupDiagnostics::Core& self,
    const std::vector<std::shared_ptr<GroupDiagnostics::Core>>& live) {
  std::vector<OtherGroup> out;
  for (const auto& core : live) {
    if (core.get() == &self) continue;
    OtherGroup g;
    g.group = core->id.group;
    g.parentRanks = core->id.parentRanks;
    g.rank = core->id.rank;
    g.size = core->id.size;
    g.backend = core->id.backend;
    g.op = currentOp(core->recorder.snapshot(kOtherGroupEntries));
    // After the entries, as in a dump: no entry is past last_seq.
    g.lastSeq = core->recorder.lastSeq();
    if (g.op && self.clockSkewUs != 0) {
      for (int64_t* t : {&g.op->issueUs, &g.op->startUs, &g.op->endUs}) {
        if (*t != 0) *t += self.clockSkewUs;
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace loom::diag
