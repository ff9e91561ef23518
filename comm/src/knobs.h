// Process-wide comm knobs that hot paths read from a cached copy (docs/env.md).
//
// Context::create calls the load functions, so every Context setup re-reads and validates
// the variables: a bad value fails setup with an InvalidArgumentError naming the variable,
// and is never cached. Code that runs without a Context (kernel tests) loads them on first
// use. chunkBytes() (algorithms/algorithms.h) and the reduce kernels read the cached copy.
#pragma once

#include <cstddef>

namespace loom::comm {

// LOOM_CHUNK_BYTES: the message size of the chunked algorithms (algorithms/chunk.cc).
size_t loadChunkBytes();

// LOOM_REDUCE_ISA: auto (AVX2 kernels where the CPU has them) or generic (reduce.cc).
void loadReduceIsa();

}  // namespace loom::comm
