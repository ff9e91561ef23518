// Reduction kernels for any x86-64 (or other) CPU; see reduce_kernels.inc.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "half.h"
#include "reduce_isa.h"

namespace loom::comm::generic {
#define LOOM_KERNELS_F16C 0
#include "reduce_kernels.inc"

ReduceFn lookupKernel(DType dtype, ReduceOp op) {
  return lookup(dtype, op);
}
void divideKernel(void* data, size_t n, DType dtype, int64_t divisor) {
  divide(data, n, dtype, divisor);
}
}  // namespace loom::comm::generic
