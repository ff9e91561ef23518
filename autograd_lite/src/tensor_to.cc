// Tensor::to: dtype conversions, including float32 <-> bfloat16/float16 (half.h).
#include <cstring>
#include <type_traits>

#include "loom/autograd/tensor.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace loom::ag {

namespace {

// Element conversions for to(): every dtype goes through double except the low-precision
// ones, which are read as and rounded from float32 (so float64 -> bfloat16 rounds twice, as
// PyTorch's conversion does).
template <class D>
D convertElement(double v) {
  return static_cast<D>(v);
}
template <>
BFloat16 convertElement<BFloat16>(double v) {
  return toBFloat16(static_cast<float>(v));
}
template <>
Float16 convertElement<Float16>(double v) {
  return toFloat16(static_cast<float>(v));
}
template <class S>
double elementValue(S v) {
  return static_cast<double>(v);
}
template <>
double elementValue<BFloat16>(BFloat16 v) {
  return toFloat(v);
}
template <>
double elementValue<Float16>(Float16 v) {
  return toFloat(v);
}

// float32 <-> float16 over arrays: the F16C instructions where the build has them (IEEE round
// to nearest even, NaN kept quiet: bitwise what toFloat16/toFloat give, which a test checks),
// else the scalar conversions. The scalar float16 rounding has branches the compiler cannot
// vectorize, and fp16 autocast converts every matmul operand.
void floatToHalf(const float* src, Float16* dst, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = toFloat16(src[i]);
}

void halfToFloat(const Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = toFloat(src[i]);
}

// n elements of type S at src to type D at dst. (A function template, not a branch inside
// to()'s nested generic lambdas: clang 14 instantiates the discarded `if constexpr` branches
// there, which do not compile for every pair of types.)
template <class S, class D>
void convertArray(const S* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, BFloat16>) {
    for (int64_t i = 0; i < n; ++i) dst[i] = toBFloat16(src[i]);
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Float16>) {
    floatToHalf(src, dst, n);
  } else if constexpr (std::is_same_v<S, Float16> && std::is_same_v<D, float>) {
    halfToFloat(src, dst, n);
  } else if constexpr ((std::is_same_v<S, BFloat16> ||
                        std::is_same_v<S, Float16>)&&std::is_same_v<D, float>) {
    for (int64_t i = 0; i < n; ++i) dst[i] = toFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convertElement<D>(elementValue(src[i]));
  }
}

// Calls f.template operator()<T>() with T the element type of dtype.
template <class F>
void forEachDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f.template operator()<float>();
      return;
    case DType::kFloat64:
      f.template operator()<double>();
      return;
    case DType::kInt64:
      f.template operator()<int64_t>();
      return;
    case DType::kBFloat16:
      f.template operator()<BFloat16>();
      return;
    case DType::kFloat16:
      f.template operator()<Float16>();
      return;
  }
}
}  // namespace

Tensor Tensor::to(DType target) const {
  checkDefined("to");
  Tensor out = empty(shape(), target);
  const int64_t n = numel();
  if (target == dtype()) {
    std::memcpy(out.rawData(), rawData(), nbytes());
    return out;
  }
  forEachDType(dtype(), [&]<class S>() {
    const S* src = data<S>();
    forEachDType(target, [&]<class D>() { convertArray(src, out.data<D>(), n); });
  });
  return out;
}

}  // namespace loom::ag
