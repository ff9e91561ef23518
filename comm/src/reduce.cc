#include "loom/comm/reduce.h"

#include <cstdlib>
#include <string_view>

#include "half.h"
#include "loom/common/error.h"
#include "reduce_isa.h"

namespace loom::comm {

namespace {

// LOOM_REDUCE_ISA=generic forces the portable kernels (tests run both).
bool useAvx2() {
#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
  static const bool yes = [] {
    const char* env = std::getenv("LOOM_REDUCE_ISA");
    if (env != nullptr && std::string_view(env) == "generic") return false;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace

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
