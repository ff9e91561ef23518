#include "loom/store/store.h"

#include "loom/common/error.h"

namespace loom {

std::vector<Bytes> Store::multiGet(const std::vector<std::string>& keys) {
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  LOOM_CHECK_EQ(keys.size(), values.size(), "multiSet needs one value per key");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace loom
