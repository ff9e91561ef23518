#include "loom/comm/reduce.h"

#include <atomic>

#include "half.h"
#include "knobs.h"
#include "loom/common/env.h"
#include "loom/common/error.h"
#include "reduce_isa.h"

namespace loom::comm {

namespace {

// 1: the AVX2 kernels, 0: the portable ones, -1: LOOM_REDUCE_ISA not read yet (loadReduceIsa).
std::atomic<int> gUseAvx2{-1};

bool useAvx2() {
  int use = gUseAvx2.load(std::memory_order_relaxed);
  if (use < 0) {
    loadReduceIsa();
    use = gUseAvx2.load(std::memory_order_relaxed);
  }
  return use == 1;
}

}  // namespace

// LOOM_REDUCE_ISA=generic forces the portable kernels (tests run both); auto takes AVX2 where
// the CPU has AVX2, FMA and F16C.
void loadReduceIsa() {
  const bool generic = env::choice("LOOM_REDUCE_ISA", {"auto", "generic"}, "auto") == "generic";
#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
  const bool avx2 = !generic && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
#else
  const bool avx2 = false;
  (void)generic;
#endif
  gUseAvx2.store(avx2 ? 1 : 0, std::memory_order_relaxed);
}

ReduceFn reduceFunction(DType dtype, ReduceOp op) {
  checkReduceOp(op, dtype);
#ifdef LOOM_HAVE_AVX2_KERNELS
  ReduceFn fn = useAvx2() ? avx2::lookupKernel(dtype, op) : generic::lookupKernel(dtype, op);
#else
  ReduceFn fn = generic::lookupKernel(dtype, op);
#endif
  LOOM_CHECK(fn != nullptr, "no reduce kernel for ", reduceOpName(op), " on ", dtypeName(dtype));
  return fn;
}

void divideBy(void* data, size_t n, DType dtype, int64_t divisor) {
  LOOM_CHECK(divisor > 0, "divisor must be positive, got ", divisor);
#ifdef LOOM_HAVE_AVX2_KERNELS
  if (useAvx2()) return avx2::divideKernel(data, n, dtype, divisor);
#endif
  generic::divideKernel(data, n, dtype, divisor);
}

const char* reduceKernelIsa() {
  return useAvx2() ? "avx2" : "generic";
}

uint16_t floatToHalf(float value) {
  return half::fromFloat(value);
}
float halfToFloat(uint16_t bits) {
  return half::toFloat(bits);
}
uint16_t floatToBFloat16(float value) {
  return half::bf16FromFloat(value);
}
float bfloat16ToFloat(uint16_t bits) {
  return half::bf16ToFloat(bits);
}

}  // namespace loom::comm
