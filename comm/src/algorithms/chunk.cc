#include <cstdlib>

#include "algorithms/algorithms.h"

namespace loom::comm {

size_t chunkBytes() {
  static const size_t bytes = [] {
    const char* env = std::getenv("LOOM_CHUNK_BYTES");
    long v = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
    return v > 0 ? static_cast<size_t>(v) : size_t{512} << 10;
  }();
  return bytes;
}

}  // namespace loom::comm
