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
    if (d) details += "\n  rank " + std::to_string(d->rank) + " " + activity(*d);
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
