// The per-instruction-set kernel tables (reduce_generic.cc, reduce_avx2.cc); reduce.cc picks
// one at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/comm/reduce.h"

namespace loom::comm {
namespace generic {
ReduceFn lookupKernel(DType dtype, ReduceOp op);
void divideKernel(void* data, size_t n, DType dtype, int64_t divisor);
}  // namespace generic
namespace avx2 {
ReduceFn lookupKernel(DType dtype, ReduceOp op);
void divideKernel(void* data, size_t n, DType dtype, int64_t divisor);
}  // namespace avx2
}  // namespace loom::comm
