// Differentiable operations. Each op's backward is written next to its forward in src/ops_*.cc.
//
// All ops take float32 or float64 tensors (never mixed) and return new tensors; none modify
// their inputs. Shapes are stated per op; "broadcast" means NumPy rules (trailing dimensions
// aligned, a dimension of 1 or a missing one stretches), so a row vector [N] or a scalar
// combines with [M, N]. A bad shape or dtype throws std::invalid_argument naming the op and
// both shapes.
#pragma once

#include <cstdint>

#include "loom/autograd/tensor.h"

namespace loom::ag {

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
// a: [M, K], b: [K, N] -> [M, N].
Tensor matmul(const Tensor& a, const Tensor& b);
// a: [M, N] -> [M, N]^T = [N, M] (a copy; storage stays contiguous).
Tensor transpose(const Tensor& a);
// x: [B, in], weight: [out, in] (PyTorch's layout), bias: [out] or undefined -> [B, out].
// Fused x @ weight^T + bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- reductions (dim may be negative) ----
Tensor sum(const Tensor& x);  // -> 0-d
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);  // -> 0-d
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor logSoftmax(const Tensor& x, int64_t dim);

// ---- losses (mean reduction, 0-d result) ----
// logits: [N, C] float; labels: [N] int64 in [0, C).
Tensor crossEntropy(const Tensor& logits, const Tensor& labels);
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

// weight: [V, D]; indices: int64, any shape, values in [0, V) -> indices.shape + [D].
Tensor embedding(const Tensor& weight, const Tensor& indices);

}  // namespace loom::ag
