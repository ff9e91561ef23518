#include "loom/comm/reduce.h"

#include <atomic>

#include "half.h"
#include "loom/common/error.h"
#include "reduce_isa.h"

namespace loom::comm {

namespace {

bool cpuHasAvx2() {
#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
  __builtin_cpu_init();  // may run before the constructors that would call it
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// The AVX2 kernels run where the CPU has them until setReduceIsa says otherwise.
std::atomic<bool> gUseAvx2{cpuHasAvx2()};

bool useAvx2() {
  return gUseAvx2.load(std::memory_order_relaxed);
}

}  // namespace

void setReduceIsa(ReduceIsa isa) {
  gUseAvx2.store(isa == ReduceIsa::kAuto && cpuHasAvx2(), std::memory_order_relaxed);
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
