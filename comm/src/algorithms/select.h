// Algorithm selection: opts.algorithm when set, else the Context's forced algorithm
// (ContextOptions::algorithm), else a choice by message size and world size from crossovers
// measured with bench/kernels/loom_comm_timing (see select.cc for the figures).
#pragma once

#include <cstddef>

#include "loom/comm/collectives.h"
#include "loom/comm/tuning.h"
#include "tag.h"

namespace loom::comm {

// Throws InvalidArgumentError when `requested` (CollectiveOptions::algorithm) is neither kAuto
// nor implemented for collective `kind`. Called once per call, before any message.
void checkAlgorithm(OpType kind, Algorithm requested);

// Returns the algorithm to run for collective `kind` with `bytes` per rank (the buffer one
// rank contributes): `requested` (already checked) when set, else the Context's forced
// algorithm (ContextOptions::algorithm) when `kind` implements it (so that forcing rd changes
// all-reduce without breaking broadcast), else the automatic choice.
// `crossovers`: a tuning file's (tuning.h); null takes the built-in table for `size` ranks.
Algorithm selectAlgorithm(OpType kind, Algorithm requested, Algorithm forced, size_t bytes,
                          int size, const Crossovers* crossovers = nullptr);

}  // namespace loom::comm
