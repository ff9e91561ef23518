// explain(): every rank's flight record -> one explanation of a hang or failure.
//
// How it works: each rank's record lists its last collectives by sequence number (the same
// on every rank). The first collective that did not complete everywhere, `stuck`, is the
// smallest sequence number that some rank has not finished: either its entry there is not
// done, or the rank never issued it while another rank did (its last_seq is lower). At
// `stuck` every rank falls in one of these classes:
//   - never entered: its last_seq < stuck; what it does instead is its newest entry (running
//     or queued: "is in broadcast#1580"; finished: "idle since ...");
//   - entered: grouped by signature (op, dtype, count, reduce op, root); two or more groups
//     are a mismatch, and the summary prints each signature with its ranks; otherwise the
//     ranks are grouped by state ("wait in", "failed in", "completed");
//   - missing: no record arrived (dead, stopped, or cut off from the store).
// A rank that never entered `stuck` and has nothing unfinished here may be blocked in another
// group of its process (RankDump::otherGroups: the group, and the operation it is in there).
// Then the summary names that operation and group; when a rank that waits here at `stuck` has
// not entered that operation (its own record of the same other group has a lower last_seq),
// each waits for the other: the ranks called the two groups' collectives in different orders
// (a cross-group deadlock), and the summary says so.
// Times are told relative to each rank's own dump time, so clocks of different hosts never
// have to agree.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "loom/process_group/diagnostics.h"

namespace loom::diag {

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string humanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

std::string seconds(int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(us) / 1e6);
  return buf;
}

// "allreduce#5 (8 B float)"
std::string withSize(const OpRecord& r) {
  if (r.type == OpType::kBarrier) return r.describe();
  return r.describe() + " (" + humanBytes(r.bytes) + " " + dtypeName(r.dtype) + ")";
}

// What a rank does now, from its newest entry: "is in broadcast#7 (running for 3.0 s)".
std::string activity(const RankDump& d) {
  if (d.entries.empty()) return "has issued no operation";
  const OpRecord& last = d.entries.back();
  switch (last.state) {
    case OpState::kRunning:
      return "is in " + withSize(last) + ", running for " + seconds(d.timeUs - last.startUs);
    case OpState::kQueued:
      return "is in " + withSize(last) + ", issued " + seconds(d.timeUs - last.issueUs) +
             " ago and not started";
    case OpState::kFailed:
      return "failed in " + withSize(last);
    case OpState::kDone:
      return "is idle since " + last.describe() + " completed " + seconds(d.timeUs - last.endUs) +
             " before its dump; nothing issued since";
  }
  return "?";
}

bool unfinished(const OpRecord& r) {
  return r.state == OpState::kQueued || r.state == OpState::kRunning;
}

// How users name a group: 'group "A" (parent ranks 0,1)', 'an unnamed group of 2 ranks';
// `note`, when not empty, joins the parenthesis: 'group "A" (parent ranks 0,1; <note>)'.
std::string groupLabel(const std::string& name, const std::vector<int>& parentRanks, int size,
                       const std::string& note = "") {
  std::string ranks;
  for (size_t i = 0; i < parentRanks.size(); ++i) {
    ranks += (i ? "," : "") + std::to_string(parentRanks[i]);
  }
  std::string label;
  std::string inside;
  if (!name.empty()) {
    label = "group \"" + name + "\"";
    if (!ranks.empty()) inside = "parent ranks " + ranks;
  } else if (!ranks.empty()) {
    label = "the unnamed group of parent ranks " + ranks;
  } else {
    label = "an unnamed group of " + std::to_string(size) + " ranks";
  }
  if (!note.empty()) inside += (inside.empty() ? "" : "; ") + note;
  return inside.empty() ? label : label + " (" + inside + ")";
}

// A group named beside the one analysed: an unnamed one is 'another unnamed group of N ranks'.
std::string otherLabel(const std::string& name, const std::vector<int>& parentRanks, int size,
                       const std::string& note = "") {
  if (!name.empty() || !parentRanks.empty()) return groupLabel(name, parentRanks, size, note);
  return "another unnamed group of " + std::to_string(size) + " ranks" +
         (note.empty() ? "" : " (" + note + ")");
}

// The group analysed, where another is named too: an unnamed one is 'this group'.
std::string thisLabel(const std::string& name, const std::vector<int>& parentRanks, int size) {
  return name.empty() && parentRanks.empty() ? "this group" : groupLabel(name, parentRanks, size);
}

// Whether two ranks' records of their other groups are of one group.
bool sameGroup(const OtherGroup& a, const OtherGroup& b) {
  return a.group == b.group && a.parentRanks == b.parentRanks && a.size == b.size &&
         a.backend == b.backend;
}

// What `d`'s process does in its other group `g` (its op set): 'is blocked in allreduce#1 of
// group "B" (parent ranks 0,1; running for 30.1 s)'.
std::string elsewhere(const RankDump& d, const OtherGroup& g) {
  const OpRecord& op = *g.op;
  const auto in = [&](const std::string& note) {
    return op.describe() + " of " + otherLabel(g.group, g.parentRanks, g.size, note);
  };
  switch (op.state) {
    case OpState::kRunning:
      return "is blocked in " + in("running for " + seconds(d.timeUs - op.startUs));
    case OpState::kQueued:
      return "is blocked in " +
             in("issued " + seconds(d.timeUs - op.issueUs) + " ago, not started");
    case OpState::kFailed:
      return "failed in " + in(seconds(d.timeUs - op.endUs) + " before its dump");
    case OpState::kDone:
      break;
  }
  return "is idle in " + otherLabel(g.group, g.parentRanks, g.size);
}

// The other group `d`'s rank is inside an operation of: one with an unfinished collective,
// else an unfinished operation, else a failed one (it got stuck there and gave up); null.
const OtherGroup* busyElsewhere(const RankDump& d) {
  const OtherGroup* best = nullptr;
  int bestScore = 0;
  for (const OtherGroup& g : d.otherGroups) {
    if (!g.op) continue;
    const int score = unfinished(*g.op)                 ? (isCollective(g.op->type) ? 3 : 2)
                      : g.op->state == OpState::kFailed ? 1
                                                        : 0;
    if (score > bestScore) {
      best = &g;
      bestScore = score;
    }
  }
  return best;
}

// 'group "A"' for a named group (the full label otherwise), where a sentence names it again.
std::string shortLabel(const std::string& name, const std::vector<int>& parentRanks, int size,
                       bool analysed) {
  if (!name.empty()) return "group \"" + name + "\"";
  return analysed ? thisLabel(name, parentRanks, size) : otherLabel(name, parentRanks, size);
}

// A detail line's tail: where the rank's process is busy in another group, if anywhere.
std::string elsewhereNote(const RankDump& d) {
  const OtherGroup* g = busyElsewhere(d);
  return g == nullptr ? "" : "; it " + elsewhere(d, *g);
}

const OpRecord* collectiveAt(const RankDump& d, uint64_t seq) {
  for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
    if (isCollective(it->type) && it->seq == seq) return &*it;
  }
  return nullptr;
}

// The smallest collective sequence number this rank has issued but not finished, or 0.
uint64_t firstUnfinished(const RankDump& d) {
  for (const OpRecord& r : d.entries) {
    if (isCollective(r.type) && r.state != OpState::kDone) return r.seq;
  }
  return 0;
}

// Rank `d.rank` never entered collective #`stuck` (`what`: its name, "allreduce#5") and is
// inside `other`'s operation: where, and, when ranks that entered #`stuck` here and have not
// finished it have not entered that operation there, the cross-group deadlock.
std::string blockedElsewhere(const std::vector<std::optional<RankDump>>& dumps, uint64_t stuck,
                             const std::string& what, const RankDump& d, const OtherGroup& other) {
  std::string out = "rank " + std::to_string(d.rank) + " never entered " + what + " of " +
                    thisLabel(d.group, d.parentRanks, d.size) + ": it " + elsewhere(d, other);
  if (!isCollective(other.op->type)) return out;
  std::vector<int> behind;  // their ranks here
  std::string theirRanks;   // their ranks there, when they differ
  for (const auto& w : dumps) {
    if (!w || w->rank == d.rank || w->lastSeq < stuck) continue;
    const OpRecord* mine = collectiveAt(*w, stuck);
    if (mine == nullptr || mine->state == OpState::kDone) continue;
    for (const OtherGroup& g : w->otherGroups) {
      if (!sameGroup(g, other) || g.lastSeq >= other.op->seq) continue;
      behind.push_back(w->rank);
      if (g.rank != w->rank) {
        theirRanks += std::string(theirRanks.empty() ? "" : ", ") + "rank " +
                      std::to_string(w->rank) + " is rank " + std::to_string(g.rank) + " there";
      }
      break;
    }
  }
  if (behind.empty()) return out;
  out += ", which " + rankList(behind) + (behind.size() == 1 ? " has" : " have") + " not entered" +
         (theirRanks.empty() ? "" : " (" + theirRanks + ")") + ": the ranks issue collectives on " +
         shortLabel(d.group, d.parentRanks, d.size, true) + " and " +
         shortLabel(other.group, other.parentRanks, other.size, false) +
         " in different orders (a cross-group deadlock); every rank must call collectives on "
         "groups that share ranks in the same order";
  return out;
}

}  // namespace

std::string explain(const std::vector<std::optional<RankDump>>& dumps,
                    const std::vector<std::string>& absentWhy) {
  // Missing ranks with a note (from their heartbeat) are told one by one, the others together.
  const auto why = [&](int rank) -> const std::string& {
    static const std::string none;
    return static_cast<size_t>(rank) < absentWhy.size() ? absentWhy[rank] : none;
  };
  const auto missingParts = [&](const std::vector<int>& missing) {
    std::vector<std::string> out;
    std::vector<int> plain;
    for (int r : missing) {
      if (why(r).empty()) {
        plain.push_back(r);
      } else {
        out.push_back("rank " + std::to_string(r) + " sent no flight record: " + why(r));
      }
    }
    if (!plain.empty()) {
      out.push_back(rankList(plain) +
                    ": no flight record arrived (dead, stopped, or cut off from the store)");
    }
    return out;
  };
  std::vector<int> missing;
  uint64_t maxSeq = 0;
  for (size_t r = 0; r < dumps.size(); ++r) {
    if (!dumps[r]) {
      missing.push_back(static_cast<int>(r));
      continue;
    }
    maxSeq = std::max(maxSeq, dumps[r]->lastSeq);
  }
  uint64_t stuck = 0;
  const auto consider = [&](uint64_t seq) {
    if (seq != 0 && (stuck == 0 || seq < stuck)) stuck = seq;
  };
  for (const auto& d : dumps) {
    if (!d) continue;
    consider(firstUnfinished(*d));
    if (d->lastSeq < maxSeq) consider(d->lastSeq + 1);
  }

  std::vector<std::string> parts;
  std::string details;
  for (const auto& d : dumps) {
    if (d) {
      details += "\n  rank " + std::to_string(d->rank) + " " + activity(*d) + elsewhereNote(*d);
    }
  }
  if (stuck == 0) {
    std::string summary = "every rank with a flight record completed every collective it issued";
    if (maxSeq > 0) summary += " (up to #" + std::to_string(maxSeq) + ")";
    for (const std::string& p : missingParts(missing)) summary += "; " + p;
    return summary + details;
  }

  std::vector<int> absent;  // never entered `stuck`
  std::map<std::string, std::vector<int>> bySignature;
  std::map<std::string, const OpRecord*> example;
  for (const auto& d : dumps) {
    if (!d) continue;
    const OpRecord* r = collectiveAt(*d, stuck);
    if (d->lastSeq < stuck || r == nullptr) {
      if (d->lastSeq < stuck) absent.push_back(d->rank);
      // Issued but rotated out of the ring: it finished long ago; not a suspect.
      continue;
    }
    bySignature[r->signature()].push_back(d->rank);
    example[r->signature()] = r;
  }

  // A mismatch at a later collective can be the cause of the failure at `stuck` (a rank that
  // found it aborted, and a slow rank still finishing `stuck` lost its last message): the first
  // sequence number after `stuck` where the ranks that issued it disagree leads the summary.
  std::string laterMismatch;
  for (uint64_t seq = stuck + 1; seq <= maxSeq && bySignature.size() <= 1; ++seq) {
    std::map<std::string, std::vector<int>> at;
    for (const auto& d : dumps) {
      if (!d || d->lastSeq < seq) continue;
      if (const OpRecord* r = collectiveAt(*d, seq)) at[r->signature()].push_back(d->rank);
    }
    if (at.size() <= 1) continue;
    laterMismatch = "mismatched collective #" + std::to_string(seq) + " (different signatures):";
    for (const auto& [signature, ranks] : at) {
      laterMismatch += " " + rankList(ranks) + " called " + signature + ";";
    }
    laterMismatch.pop_back();
    break;
  }
  if (!laterMismatch.empty()) parts.push_back(laterMismatch);

  for (int rank : absent) {
    const RankDump& d = *dumps[rank];
    // Nothing unfinished here: it may be stuck in another group of its process.
    const OtherGroup* other =
        d.entries.empty() || !unfinished(d.entries.back()) ? busyElsewhere(d) : nullptr;
    if (other != nullptr) {
      const std::string what = bySignature.size() == 1 ? example.begin()->second->describe()
                                                       : "collective #" + std::to_string(stuck);
      parts.push_back(blockedElsewhere(dumps, stuck, what, d, *other));
      continue;
    }
    parts.push_back("rank " + std::to_string(rank) + " never entered collective #" +
                    std::to_string(stuck) + ": it " + activity(d));
  }
  if (bySignature.size() > 1) {
    std::string mismatch =
        "mismatched collective #" + std::to_string(stuck) + " (different signatures):";
    for (const auto& [signature, ranks] : bySignature) {
      mismatch += " " + rankList(ranks) + " called " + signature + ";";
    }
    mismatch.pop_back();
    parts.insert(parts.begin(), mismatch);
  } else if (!bySignature.empty()) {
    const OpRecord& r = *example.begin()->second;
    std::map<OpState, std::vector<int>> byState;
    for (const auto& d : dumps) {
      if (!d) continue;
      if (const OpRecord* mine = collectiveAt(*d, stuck); mine && d->lastSeq >= stuck) {
        byState[mine->state].push_back(d->rank);
      }
    }
    for (const auto& [state, ranks] : byState) {
      const char* verb = state == OpState::kFailed   ? " failed in "
                         : state == OpState::kDone   ? " completed "
                         : state == OpState::kQueued ? " have queued "
                                                     : " wait in ";
      if (ranks.size() == 1 && state == OpState::kQueued) verb = " has queued ";
      if (ranks.size() == 1 && state == OpState::kRunning) verb = " waits in ";
      parts.push_back(rankList(ranks) + verb + withSize(r));
    }
  }
  for (std::string& p : missingParts(missing)) parts.push_back(std::move(p));
  std::string summary;
  for (const std::string& p : parts) summary += (summary.empty() ? "" : "; ") + p;
  return summary + details;
}

}  // namespace loom::diag
