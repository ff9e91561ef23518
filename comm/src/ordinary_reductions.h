// A scope in which this thread's collectives reduce the ordinary way, whatever
// CollectiveOptions::reproducible and ContextOptions::reproducible say: the reproducible mode's
// two-rank path runs the ordinary SUM inside it (reproducible.cc), where one IEEE addition per
// element is the answer. Scopes nest; each restores what it found.
#pragma once

#include <cstddef>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"

namespace loom::comm {

class Context;

class OrdinaryReductions {
 public:
  OrdinaryReductions();
  ~OrdinaryReductions();
  OrdinaryReductions(const OrdinaryReductions&) = delete;
  OrdinaryReductions& operator=(const OrdinaryReductions&) = delete;

  // Whether this thread is inside such a scope.
  static bool active();

 private:
  bool previous_;
};

// The ordinary all-reduce, reduce or even reduce-scatter (type) of a call the public entry
// already validated, straight to the engine (collectives.cc): the reproducible mode's two-rank
// SUM runs here inside an OrdinaryReductions scope, without a second validation and dispatch.
void runValidatedOrdinary(Context& ctx, OpType type, const void* in, void* out, size_t count,
                          DType dtype, ReduceOp op, int root, const CollectiveOptions& opts);

}  // namespace loom::comm
