// chunkBytes(): the size of the messages the chunked algorithms cut their data into,
// LOOM_CHUNK_BYTES (a byte count in [4 KiB, 1 GiB], default 512 KiB), as last read by
// loadChunkBytes (knobs.h) at Context setup.
#include <atomic>

#include "algorithms/algorithms.h"
#include "knobs.h"
#include "loom/common/env.h"

namespace loom::comm {

namespace {

constexpr size_t kDefaultChunkBytes = size_t{512} << 10;

std::atomic<size_t> gChunkBytes{0};  // 0: not loaded yet

}  // namespace

size_t loadChunkBytes() {
  const size_t bytes = env::bytes("LOOM_CHUNK_BYTES", 4096, size_t{1} << 30, kDefaultChunkBytes);
  gChunkBytes.store(bytes, std::memory_order_relaxed);
  return bytes;
}

size_t chunkBytes() {
  const size_t bytes = gChunkBytes.load(std::memory_order_relaxed);
  return bytes != 0 ? bytes : loadChunkBytes();
}

}  // namespace loom::comm
