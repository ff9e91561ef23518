// Reduction kernels: one type-erased function per (dtype, op), chosen once per collective.
//
// Contract
// - ReduceFn computes dst[i] = a[i] (op) b[i] for i < n. dst may equal a or b exactly (in
//   place); partial overlap is not allowed. The three-operand form lets an algorithm reduce a
//   received chunk and the caller's input straight into the output without a copy.
// - Integer sum and prod wrap around modulo 2^bits (computed in unsigned arithmetic, so there
//   is no undefined behaviour). bool: sum/max/bor are logical or, prod/min/band logical and,
//   bxor exclusive or; inputs must be 0 or 1.
// - Floating-point min and max propagate NaN (a NaN in either operand gives a NaN), unlike
//   std::fmin/fmax, and order -0 below +0 (IEEE 754-2019 minimum / maximum), so that the result
//   does not depend on the operands' order (only a NaN's payload may). float16 and bfloat16
//   are widened to float, combined, and rounded once (round to nearest even; NaN stays NaN with
//   its sign, overflow gives infinity).
// - avg: the kernel is the sum's; algorithms divide once at the end with divideBy (integers:
//   C++ integer division of the wrapped sum by the world size, truncating toward zero). For
//   float16 and bfloat16 the collectives (collectives.cc) divide every input first and sum,
//   as NCCL does: a 16-bit sum overflows where the average fits.
// - Kernels are compiled twice (generic x86-64 and AVX2+F16C+FMA, both -O3 so the compiler
//   vectorises the loops); the AVX2 build runs where the CPU supports it unless
//   setReduceIsa(kGeneric) forced the portable one (Context::create calls it with
//   ContextOptions::reduceIsa, so LOOM_REDUCE_ISA=generic has that effect).
// - Thread-safe; the only state is the process-wide ISA choice.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/comm/types.h"

namespace loom::comm {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t n);

// Throws InvalidArgumentError (via checkReduceOp) for a bitwise op on a floating dtype.
ReduceFn reduceFunction(DType dtype, ReduceOp op);

// data[i] /= divisor, in the dtype's arithmetic (half types round once).
void divideBy(void* data, size_t n, DType dtype, int64_t divisor);

// Which build of the reduce kernels runs.
enum class ReduceIsa : uint8_t {
  kAuto,     // AVX2/FMA/F16C where the CPU has them
  kGeneric,  // the portable kernels
};
// Process-wide: the last call wins (every Context::create calls it). Kernels looked up earlier
// keep the build they got.
void setReduceIsa(ReduceIsa isa);
// The instruction set the kernels run with: "avx2" or "generic".
const char* reduceKernelIsa();

// IEEE binary16 and bfloat16 conversions (round to nearest even).
uint16_t floatToHalf(float value);
float halfToFloat(uint16_t bits);
uint16_t floatToBFloat16(float value);
float bfloat16ToFloat(uint16_t bits);

}  // namespace loom::comm
