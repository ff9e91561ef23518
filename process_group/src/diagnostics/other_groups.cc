#include "diagnostics/other_groups.h"

#include <unistd.h>

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

// Whether `a` and `b` are two ranks of one group (ranks as threads of one process).
bool otherRankOfOneGroup(const Identity& a, const Identity& b) {
  return a.rank != b.rank && a.group == b.group && a.size == b.size &&
         a.parentRanks == b.parentRanks && a.backend == b.backend;
}

}  // namespace

std::vector<OtherGroup> otherGroups(
    const GroupDiagnostics::Core& self,
    const std::vector<std::shared_ptr<GroupDiagnostics::Core>>& live) {
  // A process that holds several ranks of one group (ranks as threads, in tests) is not one
  // rank there: what it does elsewhere says nothing of `self`'s rank, and which of them is
  // `self`'s rank's is unknown.
  const auto severalRanks = [&](const GroupDiagnostics::Core& group) {
    for (const auto& core : live) {
      if (otherRankOfOneGroup(core->id, group.id)) return true;
    }
    return false;
  };
  if (severalRanks(self)) return {};
  std::vector<OtherGroup> out;
  const long pid = static_cast<long>(::getpid());
  for (const auto& core : live) {
    // A group of the process this one was forked from is not this process's.
    if (core.get() == &self || core->pid != pid || severalRanks(*core)) continue;
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
