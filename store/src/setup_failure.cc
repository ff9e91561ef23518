#include "loom/store/setup_failure.h"

#include <algorithm>

#include "loom/common/error.h"

namespace loom {

void publishSetupFailure(Store& store, const std::string& key,
                         const std::exception& error) noexcept {
  const char* kind = dynamic_cast<const TimeoutError*>(&error) != nullptr           ? "timeout"
                     : dynamic_cast<const InvalidArgumentError*>(&error) != nullptr ? "invalid"
                                                                                    : "io";
  try {
    store.compareSet(key, Bytes{}, toBytes(detail::str(kind, "\n", error.what())));
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the store may be why
  }
}

void checkSetupFailure(Store& store, const std::string& key, const std::string& who) {
  if (!store.check({key})) return;
  const std::string text = toString(store.get(key));
  const size_t newline = text.find('\n');
  const std::string kind = newline == std::string::npos ? "" : text.substr(0, newline);
  const std::string why =
      detail::str(who, ": another rank's setup failed: ", text.substr(newline + 1));
  if (kind == "timeout") throw TimeoutError(why);
  if (kind == "invalid") throw InvalidArgumentError(why);
  throw IoError(why);
}

void waitWatchingSetup(Store& store, const std::vector<std::string>& keys, const Deadline& deadline,
                       const std::string& key, const std::string& who) {
  for (;;) {
    checkSetupFailure(store, key, who);
    try {
      store.wait(keys, std::min(deadline.remaining(), milliseconds(500)));
      return;
    } catch (const TimeoutError&) {
      if (deadline.expired()) throw;
    }
  }
}

}  // namespace loom
