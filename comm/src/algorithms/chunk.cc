// loadChunkBytes: LOOM_CHUNK_BYTES (a byte count in [4 KiB, 1 GiB], default 512 KiB), read at
// Context setup for the Context's generic engine.
#include "algorithms/op.h"
#include "knobs.h"
#include "loom/common/env.h"

namespace loom::comm {

size_t loadChunkBytes() {
  return env::bytes("LOOM_CHUNK_BYTES", 4096, size_t{1} << 30, kDefaultChunkBytes);
}

}  // namespace loom::comm
