// Mixed precision: the autocast scope (the counterpart of torch.autocast).
//
// How it works
// - `AutocastGuard guard(DType::kBFloat16)` (or kFloat16) turns autocast on for the calling
//   thread until the guard is destroyed; guards nest, and `AutocastGuard(dtype, false)` turns
//   it off for an inner scope. The state is thread-local: other threads are unaffected.
// - Under autocast, matmul, linear and conv2d (PyTorch's "lower_precision_fp" list) cast their
//   float32 (and other low-precision) inputs to the autocast dtype with the differentiable
//   cast(), multiply with float32 accumulation, and return the autocast dtype. float64 inputs
//   are never cast (gradient checks stay exact).
// - sum, mean, softmax, logSoftmax, layerNorm, batchNorm, crossEntropy, mseLoss, exp and log
//   (PyTorch's "fp32" list: reductions, normalizations, losses) cast bfloat16/float16 inputs to
//   float32 and return float32 under autocast.
// - Every other op runs in its inputs' dtype, as in PyTorch: a bfloat16 relu returns bfloat16
//   (computed in float32 and rounded). Binary ops on mixed dtypes promote as PyTorch does:
//   bfloat16 with float32 gives float32, bfloat16 with float16 gives float32, and a 0-d
//   operand (a Python-style scalar) never widens a dimensioned one.
// - Outside autocast, low-precision tensors follow the same per-op rules except that the fp32
//   list returns its inputs' dtype.
// - Gradients: each cast's backward casts the gradient back to the source dtype, so float32
//   master parameters get float32 gradients (rounded through the low dtype on the way, as in
//   PyTorch). Optimizers accept only float32/float64 parameters.
// - Low-precision compute path: the kernels widen bfloat16/float16 operands to float32 and use
//   the float32 gemm (OpenBLAS/Eigen), then round the product once. On this CPU class that is
//   what PyTorch's CPU bf16 matmul computes (float32 accumulation) and it reuses the tuned
//   kernel; the cost is one conversion pass per operand, and the float32 copies are what the
//   backward keeps. A cast weight is not cached across calls (PyTorch caches it per scope).
#pragma once

#include <optional>

#include "loom/autograd/tensor.h"

namespace loom::ag {

class AutocastGuard {
 public:
  // dtype must be kBFloat16 or kFloat16 (std::invalid_argument otherwise).
  explicit AutocastGuard(DType dtype = DType::kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// The autocast dtype active on this thread, or nullopt.
std::optional<DType> autocastDType();

}  // namespace loom::ag
