// Algorithm selection: opts.algorithm when set, else LOOM_ALGO (read at each call), else a
// choice by message size and world size from crossovers measured with
// bench/kernels/loom_comm_timing (see select.cc for the figures).
#pragma once

#include <cstddef>

#include "loom/comm/collectives.h"
#include "tag.h"

namespace loom::comm {

// Returns the algorithm to run for collective `kind` with `bytes` per rank (the buffer one
// rank contributes). An explicitly requested algorithm that `kind` does not implement is an
// InvalidArgumentError; one from LOOM_ALGO falls back to the automatic choice (so that
// LOOM_ALGO=rd forces all-reduce without breaking broadcast).
Algorithm selectAlgorithm(OpKind kind, Algorithm requested, size_t bytes, int size);

}  // namespace loom::comm
