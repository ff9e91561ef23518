// stragglers(): arrival skew per collective from every rank's flight record.
//
// How it works: a collective's `seq` is the same on every rank. For each seq that every record
// holds as a completed collective, the earliest start among the ranks is the reference and each
// rank's lateness is its start minus that; each rank's latenesses are then sorted for p50 / p99
// and max, and the rank with the latest start counts one `lastArrival`. Each rank's starts are
// first moved onto rank 0's clock by the offset its record carries (clockOffsetUs).
#include <algorithm>
#include <cstdio>
#include <map>

#include "loom/process_group/diagnostics.h"

namespace loom::diag {

namespace {

double percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t at = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(at, sorted.size() - 1)];
}

}  // namespace

StragglerTable stragglers(const std::vector<std::optional<RankDump>>& dumps) {
  StragglerTable table;
  // seq -> start time per rank (index into `present`).
  std::vector<int> present;
  for (const auto& d : dumps) {
    if (d) present.push_back(d->rank);
  }
  if (present.empty()) return table;
  std::map<uint64_t, std::vector<int64_t>> starts;
  for (size_t i = 0; i < present.size(); ++i) {
    for (const OpRecord& r : dumps[present[i]]->entries) {
      if (!isCollective(r.type) || r.state != OpState::kDone || r.startUs == 0 || !r.precise) {
        continue;
      }
      auto& row = starts[r.seq];
      if (row.empty()) row.assign(present.size(), 0);
      // On rank 0's clock: a host whose clock runs ahead would otherwise look late by as much.
      row[i] = r.startUs - dumps[present[i]]->clockOffsetUs;
    }
  }
  std::vector<std::vector<double>> late(present.size());
  std::vector<uint64_t> last(present.size(), 0);
  for (const auto& [seq, row] : starts) {
    if (std::find(row.begin(), row.end(), 0) != row.end()) continue;  // not on every rank
    const int64_t first = *std::min_element(row.begin(), row.end());
    const auto latest = std::max_element(row.begin(), row.end());
    for (size_t i = 0; i < row.size(); ++i) {
      late[i].push_back(static_cast<double>(row[i] - first));
    }
    ++last[static_cast<size_t>(latest - row.begin())];
    if (table.firstSeq == 0) table.firstSeq = seq;
    table.lastSeq = seq;
  }
  for (size_t i = 0; i < present.size(); ++i) {
    StragglerRow row;
    row.rank = present[i];
    row.collectives = late[i].size();
    std::sort(late[i].begin(), late[i].end());
    row.p50LatenessUs = percentile(late[i], 0.50);
    row.p99LatenessUs = percentile(late[i], 0.99);
    row.maxLatenessUs = late[i].empty() ? 0 : late[i].back();
    row.lastArrivals = last[i];
    table.ranks.push_back(row);
  }
  return table;
}

int StragglerTable::slowest() const {
  const StragglerRow* best = nullptr;
  for (const StragglerRow& r : ranks) {
    if (r.collectives == 0) continue;
    if (best == nullptr || r.p50LatenessUs > best->p50LatenessUs ||
        (r.p50LatenessUs == best->p50LatenessUs && r.lastArrivals > best->lastArrivals)) {
      best = &r;
    }
  }
  return best == nullptr ? -1 : best->rank;
}

std::string StragglerTable::format() const {
  const int slow = slowest();
  if (slow < 0) return "no collective completed on every rank in the flight records";
  std::string out;
  char line[200];
  for (const StragglerRow& r : ranks) {
    std::snprintf(line, sizeof line,
                  "rank %d: lateness p50 %.1f us, p99 %.1f us, max %.1f us; last in %llu of %llu "
                  "collectives\n",
                  r.rank, r.p50LatenessUs, r.p99LatenessUs, r.maxLatenessUs,
                  static_cast<unsigned long long>(r.lastArrivals),
                  static_cast<unsigned long long>(r.collectives));
    out += line;
  }
  const StragglerRow& s = *std::find_if(ranks.begin(), ranks.end(),
                                        [&](const StragglerRow& r) { return r.rank == slow; });
  std::snprintf(line, sizeof line,
                "slowest rank: %d (p50 +%.1f us, p99 +%.1f us, last in %.0f%% of %llu collectives "
                "#%llu-#%llu)",
                slow, s.p50LatenessUs, s.p99LatenessUs,
                100.0 * static_cast<double>(s.lastArrivals) / static_cast<double>(s.collectives),
                static_cast<unsigned long long>(s.collectives),
                static_cast<unsigned long long>(firstSeq),
                static_cast<unsigned long long>(lastSeq));
  return out + line;
}

}  // namespace loom::diag
