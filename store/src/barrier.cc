#include "loom/store/barrier.h"

#include <vector>

#include "loom/common/error.h"

namespace loom {

void storeBarrier(Store& store, const std::string& name, int rank, int worldSize,
                  milliseconds timeout) {
  LOOM_CHECK(!name.empty(), "barrier name must be non-empty");
  LOOM_CHECK(worldSize > 0, "barrier '", name, "': world size ", worldSize, " must be positive");
  LOOM_CHECK(rank >= 0 && rank < worldSize, "barrier '", name, "': rank ", rank,
             " is out of range 0..", worldSize - 1);
  Deadline deadline(timeout);
  const int64_t round = store.add(detail::str(name, "/calls/", rank), 1);
  const std::string base = detail::str(name, "/", round, "/");
  store.set(base + std::to_string(rank), toBytes("1"));
  std::vector<std::string> keys;
  keys.reserve(worldSize);
  for (int r = 0; r < worldSize; ++r) keys.push_back(base + std::to_string(r));
  try {
    store.wait(keys, deadline.remaining());
  } catch (const TimeoutError&) {
    std::string missing;
    int arrived = 0;
    for (int r = 0; r < worldSize; ++r) {
      if (store.check({keys[r]})) {
        ++arrived;
      } else {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (missing.empty()) return;  // everyone arrived just as the deadline passed
    LOOM_THROW(TimeoutError, "rank ", rank, ": barrier '", name, "' #", round, " timed out after ",
               deadline.elapsed().count(), " ms: ", arrived, "/", worldSize,
               " ranks arrived; missing ranks: ", missing);
  }
}

}  // namespace loom
