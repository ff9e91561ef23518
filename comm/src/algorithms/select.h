// Algorithm selection: opts.algorithm when set, else LOOM_ALGO (read once, when the Context is
// created), else a
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
// `fromEnvironment` is the Context's LOOM_ALGO (environmentAlgorithm).
Algorithm selectAlgorithm(OpType kind, Algorithm requested, Algorithm fromEnvironment, size_t bytes,
                          int size);

// LOOM_ALGO parsed: kAuto when unset, empty, "auto" or "shm"; an unknown name is an
// InvalidArgumentError naming the choices.
Algorithm algorithmFromEnvironment();

class Context;
// The LOOM_ALGO the Context read when it was created (contexts not made by Context::create
// read the environment at each call).
Algorithm environmentAlgorithm(Context& ctx);

}  // namespace loom::comm
