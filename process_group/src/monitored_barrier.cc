// How it works: rank r > 0 sets "monitored_barrier/<seq>/arrived/<r>" and waits for
// ".../release". Rank 0 waits for all arrival keys with the deadline; on success it deletes
// them and sets the release to "ok"; on timeout it checks which arrival keys are missing and
// sets the release to "failed\n<message>" before throwing the message itself. Each rank r > 0
// that read the release adds 1 to ".../read"; the one that brings it to size - 1 deletes the
// release and the counter, so nothing is left behind after a successful barrier.
#include "monitored_barrier.h"

#include <algorithm>
#include <vector>

#include "loom/common/error.h"
#include "loom/store/store.h"

namespace loom {

namespace {

constexpr char kFailed[] = "failed\n";

std::string prefix(uint64_t seq) {
  return "monitored_barrier/" + std::to_string(seq) + "/";
}

}  // namespace

void runMonitoredBarrier(Store& store, int rank, int size, const OpDesc& op,
                         const std::string& who) {
  if (size == 1) return;
  const std::string base = prefix(op.seq);
  const std::string release = base + "release";
  if (rank != 0) {
    store.set(base + "arrived/" + std::to_string(rank), std::string_view("1"));
    // Rank 0 answers by op.timeout; the slack lets its verdict arrive.
    const auto slack = std::max(std::chrono::milliseconds(1000), op.timeout / 4);
    try {
      store.wait({release}, op.timeout + slack);
    } catch (const TimeoutError&) {
      throw TimeoutError(who + ": " + op.describe() + " timed out after " +
                         std::to_string((op.timeout + slack).count()) +
                         " ms: rank 0, which collects the barrier, never released it");
    }
    const std::string verdict = store.getString(release);
    if (store.add(base + "read", 1) == size - 1) {
      store.deleteKey(release);
      store.deleteKey(base + "read");
    }
    if (verdict.rfind(kFailed, 0) == 0) {
      throw TimeoutError(who + ": " + op.describe() +
                         " failed on rank 0: " + verdict.substr(sizeof(kFailed) - 1));
    }
    return;
  }
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(base + "arrived/" + std::to_string(r));
  try {
    store.wait(keys, op.timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 1; r < size; ++r) {
      if (!store.check({keys[r - 1]})) missing.push_back(r);
      if (!missing.empty() && !op.waitAllRanks) break;
    }
    if (missing.empty()) {  // the last ones arrived just after the deadline
      for (const auto& key : keys) store.deleteKey(key);
      store.set(release, std::string_view("ok"));
      return;
    }
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    const std::string message =
        who + ": " + op.describe() + " timed out after " + std::to_string(op.timeout.count()) +
        " ms: " + (missing.size() == 1 ? "rank " : "ranks ") + ranks + " did not arrive" +
        (op.waitAllRanks ? "" : " (the first missing rank; waitAllRanks names them all)");
    store.set(release, kFailed + message);
    throw TimeoutError(message);
  }
  for (const auto& key : keys) store.deleteKey(key);
  store.set(release, std::string_view("ok"));
}

}  // namespace loom
