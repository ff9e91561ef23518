// Differentiable operations. Each op's backward is written next to its forward in src/ops_*.cc.
//
// All ops take float32 or float64 tensors (never mixed) and return new tensors; none modify
// their inputs. bfloat16/float16 tensors are accepted too, computed in float32: autocast.h
// gives the per-op rules (result dtypes, mixed dtypes, the autocast scope). Shapes are stated per
// op; "broadcast" means NumPy rules (trailing dimensions aligned, a dimension of 1 or a missing one
// stretches), so a row vector [N] or a scalar combines with [M, N]. A bad shape or dtype throws
// std::invalid_argument naming the op and both shapes.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "loom/autograd/tensor.h"

namespace loom::ag {

// ---- dtype ----
// x converted to dtype (x itself when it already has it), as torch's x.to(dtype): to
// bfloat16/float16 rounds to nearest even. Backward: the gradient cast back to x's dtype.
// Casting to int64 records no gradient.
Tensor cast(const Tensor& x, DType dtype);

// ---- elementwise, with broadcasting ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& a);
// The broadcast shape of a and b, or std::invalid_argument naming op.
Shape broadcastShapes(const Shape& a, const Shape& b, const char* op);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
// A double operand becomes a 0-d tensor of the other operand's dtype.
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// ---- elementwise unary ----
Tensor relu(const Tensor& x);
// The exact (erf) GELU, PyTorch's default: x * Phi(x).
Tensor gelu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);

// ---- linear algebra ----
// a: [M, K] @ b: [K, N] -> [M, N]; with batch dimensions B... (any number):
// [B..., M, K] @ [B..., K, N] -> [B..., M, N] (one product per batch entry), and either side
// may be 2-d and shared by every batch entry: [B..., M, K] @ [K, N], [M, K] @ [B..., K, N].
Tensor matmul(const Tensor& a, const Tensor& b);
// a: [M, N] -> [N, M] (a copy; storage stays contiguous).
Tensor transpose(const Tensor& a);
// x: [B..., in], weight: [out, in] (PyTorch's layout), bias: [out] or undefined ->
// [B..., out]. Fused x @ weight^T + bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- shape ops (all copy into a new contiguous tensor, except view/reshape/flatten, which
// share storage; dims may be negative; any dtype, int64 included, except causalMask) ----
// The same as x.reshape(shape): a view with a new shape, one dimension may be -1.
Tensor view(const Tensor& x, const Shape& shape);
// Dimensions startDim..endDim merged into one: [2, 3, 4, 5] with (1, 2) -> [2, 12, 5].
Tensor flatten(const Tensor& x, int64_t startDim = 0, int64_t endDim = -1);
// Swaps dimensions d0 and d1: [A, B, C] with (0, 2) -> [C, B, A].
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// out.shape[i] = x.shape[dims[i]]; dims is a permutation of 0..rank-1.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
// Elements start, start + step, ... < end along dim (Python's x[..., start:end:step]: negative
// start/end count from the end, both are clamped to [0, size]; step >= 1).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// Joins tensors along dim; all have the same rank, dtype and sizes except along dim.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// torch.split: pieces of splitSize along dim (the last may be shorter)...
std::vector<Tensor> split(const Tensor& x, int64_t splitSize, int64_t dim);
// ...or of the given sizes, which must add up to x.size(dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// x: [..., T, S] with S >= T; element (t, s) with s > t + (S - T) (a query's future keys) is
// set to `value`, the rest copied. Backward: g where copied, 0 where filled.
Tensor causalMask(const Tensor& x, double value = -std::numeric_limits<double>::infinity());

// ---- reductions (dim may be negative) ----
Tensor sum(const Tensor& x);  // -> 0-d
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);  // -> 0-d
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor logSoftmax(const Tensor& x, int64_t dim);

// ---- losses (mean reduction, 0-d result) ----
struct CrossEntropyOptions {
  // Targets equal to this are skipped: they add nothing and do not count in the mean.
  int64_t ignoreIndex = -100;
  // The target distribution is (1 - labelSmoothing) on the label plus labelSmoothing / C on
  // every class (PyTorch's label_smoothing), in [0, 1].
  double labelSmoothing = 0.0;
};
// logits: [N, C] float; labels: [N] int64 in [0, C) or ignoreIndex. The mean over the
// targets not ignored (NaN when every target is ignored, as in PyTorch).
Tensor crossEntropy(const Tensor& logits, const Tensor& labels,
                    const CrossEntropyOptions& options = {});
// mean((input - target)^2); shapes must be equal.
Tensor mseLoss(const Tensor& input, const Tensor& target);

// ---- layers' functional forms ----
// Inverted dropout: in training, zeroes each element with probability p (drawn from gen in
// row-major order) and scales the rest by 1/(1-p); otherwise (or p == 0) returns x.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

// x: [N, C]; weight, bias: [C] (either may be undefined: no affine); runningMean,
// runningVar: [C] buffers (may be undefined when training). Training: normalizes with the
// batch mean and biased variance and, when the buffers are given, updates them in place as
// PyTorch does (running = (1 - momentum) * running + momentum * batch, the variance unbiased,
// N / (N - 1)). Eval: normalizes with the running statistics.
Tensor batchNorm(const Tensor& x, const Tensor& runningMean, const Tensor& runningVar,
                 const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                 double eps = 1e-5);

// x: [..., D...] normalized over its last dims, the ones of normalizedShape (product D):
// (x - mean) / sqrt(biased var + eps) * weight + bias; weight, bias: normalizedShape (either
// may be undefined: no affine).
Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight,
                 const Tensor& bias, double eps = 1e-5);

// weight: [V, D]; indices: int64, any shape, values in [0, V) -> indices.shape + [D].
// Rows looked up at paddingIdx (in [0, V)) get no gradient (PyTorch's padding_idx).
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> paddingIdx = std::nullopt);

// ---- convolution and pooling (NCHW) ----
struct Conv2dParams {
  int64_t strideH = 1, strideW = 1;
  int64_t padH = 0, padW = 0;  // zero padding on each side
};
// x: [N, C, H, W], weight: [O, C, KH, KW], bias: [O] or undefined -> [N, O, HO, WO] with
// HO = (H + 2 padH - KH) / strideH + 1 (likewise WO); PyTorch's conv2d (cross-correlation).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dParams& params = {});
struct Pool2dParams {
  int64_t kernelH = 2, kernelW = 2;
  int64_t strideH = 2, strideW = 2;
  int64_t padH = 0, padW = 0;  // at most half the kernel, as PyTorch requires
};
// x: [N, C, H, W] -> [N, C, HO, WO], HO = (H + 2 padH - kernelH) / strideH + 1. Max: padding
// never wins; the gradient goes to the first maximum in the window (row-major), as PyTorch.
Tensor maxPool2d(const Tensor& x, const Pool2dParams& params);
// Average over the window, padding counted as zeros in the divisor (PyTorch's default
// count_include_pad=True).
Tensor avgPool2d(const Tensor& x, const Pool2dParams& params);

}  // namespace loom::ag
