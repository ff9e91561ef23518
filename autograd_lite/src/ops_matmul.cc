// Matrix products: matmul (2-d and batched), the 2-d transpose and linear, all through the
// threaded gemm kernel (gemm.h) over the tensors' own storage.
#include <stdexcept>

#include "gemm.h"
#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag {

using detail::dispatchFloat;
using detail::gemm;
using detail::gemmBatched;

namespace {

std::string shapes(const Tensor& a, const Tensor& b) {
  return shapeToString(a.shape()) + " and " + shapeToString(b.shape());
}

Shape batchDims(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 2);
}

}  // namespace

namespace {
Tensor matmulImpl(const Tensor& a, const Tensor& b);
Tensor linearImpl(const Tensor& x, const Tensor& w, const Tensor& bias);
}  // namespace

// Autocast casts the operands to its dtype; low-precision operands are multiplied as float32
// and the product rounded once (autocast.h says why).
Tensor matmul(const Tensor& a0, const Tensor& b0) {
  detail::checkDefined(a0, "matmul", "a");
  detail::checkDefined(b0, "matmul", "b");
  const Tensor a = detail::autocastLow(a0), b = detail::autocastLow(b0);
  if (detail::anyLowPrecision({&a, &b})) {
    detail::checkSameDType(a, b, "matmul");
    return cast(matmulImpl(detail::upcastLow(a), detail::upcastLow(b)), a.dtype());
  }
  return matmulImpl(a, b);
}

Tensor linear(const Tensor& x0, const Tensor& w0, const Tensor& bias0) {
  detail::checkDefined(x0, "linear", "input");
  detail::checkDefined(w0, "linear", "weight");
  const Tensor x = detail::autocastLow(x0), w = detail::autocastLow(w0);
  const Tensor bias = detail::autocastLow(bias0);
  if (detail::anyLowPrecision({&x, &w, &bias})) {
    detail::checkSameDType(x, w, "linear");
    if (bias.defined()) detail::checkSameDType(x, bias, "linear");
    return cast(linearImpl(detail::upcastLow(x), detail::upcastLow(w), detail::upcastLow(bias)),
                x.dtype());
  }
  return linearImpl(x, w, bias);
}

namespace {

// Three forms (B... = any leading batch dimensions):
//   a: [M, K],       b: [K, N]       -> [M, N]
//   a: [B..., M, K], b: [K, N]       -> [B..., M, N]   (b shared: one product of [B*M, K])
//   a: [B..., M, K], b: [B..., K, N] -> [B..., M, N]   (one product per batch entry)
//   a: [M, K],       b: [B..., K, N] -> [B..., M, N]   (a shared)
// Backward, per batch entry: ga = g b^T, gb = a^T g; a shared operand's gradient is summed
// over the batch.
Tensor matmulImpl(const Tensor& a, const Tensor& b) {
  detail::checkSameDType(a, b, "matmul");
  if (a.dim() < 2 || b.dim() < 2 || a.size(-1) != b.size(-2) ||
      (a.dim() > 2 && b.dim() > 2 && batchDims(a) != batchDims(b))) {
    throw std::invalid_argument(
        "matmul: expected [M, K] @ [K, N] with optional leading batch dimensions (equal on both, "
        "or on one side only), got " +
        shapes(a, b));
  }
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch = a.dim() > 2 ? batchDims(a) : batchDims(b);
  const int64_t nb = shapeNumel(batch);
  Shape outShape = batch;
  outShape.push_back(m);
  outShape.push_back(n);
  Tensor out = empty(outShape, a.dtype());
  const bool sharedB = b.dim() == 2, sharedA = a.dim() == 2 && b.dim() > 2;
  dispatchFloat(a.dtype(), "matmul", [&]<class T>() {
    if (sharedB) {
      gemm<T>(false, false, nb * m, n, k, a.data<T>(), k, b.data<T>(), n, out.data<T>(), n, false);
    } else {
      gemmBatched<T>(nb, false, false, m, n, k, a.data<T>(), k, sharedA ? 0 : m * k, b.data<T>(), n,
                     k * n, out.data<T>(), n, m * n, false);
    }
  });
  if (anyRequiresGrad({&a, &b})) {
    Tensor sa = b.requiresGrad() ? a.detach() : Tensor();
    Tensor sb = a.requiresGrad() ? b.detach() : Tensor();
    recordOp(
        out, "matmul", {&a, &b},
        [sa, sb, m, k, n, nb, sharedA, sharedB, shapeA = a.shape(),
         shapeB = b.shape()](const Tensor& g) {
          Tensor ga, gb;
          dispatchFloat(g.dtype(), "matmul backward", [&]<class T>() {
            const T* pg = g.data<T>();
            if (sb.defined()) {  // ga = g b^T
              ga = empty(shapeA, g.dtype());
              if (sharedB) {
                gemm<T>(false, true, nb * m, k, n, pg, n, sb.data<T>(), n, ga.data<T>(), k, false);
              } else if (sharedA) {
                ga.fill(0);
                gemmBatched<T>(nb, false, true, m, k, n, pg, n, m * n, sb.data<T>(), n, k * n,
                               ga.data<T>(), k, 0, true);
              } else {
                gemmBatched<T>(nb, false, true, m, k, n, pg, n, m * n, sb.data<T>(), n, k * n,
                               ga.data<T>(), k, m * k, false);
              }
            }
            if (sa.defined()) {  // gb = a^T g
              gb = empty(shapeB, g.dtype());
              if (sharedB) {
                gemm<T>(true, false, k, n, nb * m, sa.data<T>(), k, pg, n, gb.data<T>(), n, false);
              } else {
                gemmBatched<T>(nb, true, false, k, n, m, sa.data<T>(), k, sharedA ? 0 : m * k, pg,
                               n, m * n, gb.data<T>(), n, k * n, false);
              }
            }
          });
          return std::vector<Tensor>{ga, gb};
        });
  }
  return out;
}

}  // namespace

// a: [M, N] -> [N, M]. Backward: the gradient transposed back.
Tensor transpose(const Tensor& a) {
  detail::checkDefined(a, "transpose", "a");
  detail::checkDim(a, 2, "transpose", "a");
  return transpose(a, 0, 1);
}

namespace {

// x: [B..., in], w: [out, in], bias: [out] -> y = x w^T + bias: [B..., out]; the leading
// dimensions fold into rows = prod(B...).
// Backward: gx = g w, gw = g^T x, gbias = column sums of g.
Tensor linearImpl(const Tensor& x, const Tensor& w, const Tensor& bias) {
  detail::checkSameDType(x, w, "linear");
  if (x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1)) {
    throw std::invalid_argument("linear: expected input [..., in] and weight [out, in], got " +
                                shapes(x, w));
  }
  const int64_t in = w.size(1), outF = w.size(0);
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  if (bias.defined()) {
    detail::checkSameDType(x, bias, "linear");
    if (bias.shape() != Shape{outF}) {
      throw std::invalid_argument("linear: bias must have shape [" + std::to_string(outF) +
                                  "], got " + shapeToString(bias.shape()));
    }
  }
  Shape yShape = x.shape();
  yShape.back() = outF;
  Tensor y = empty(yShape, x.dtype());
  dispatchFloat(x.dtype(), "linear", [&]<class T>() {
    T* py = y.data<T>();
    gemm<T>(false, true, rows, outF, in, x.data<T>(), in, w.data<T>(), in, py, outF, false);
    if (bias.defined()) {
      const T* pb = bias.data<T>();
      for (int64_t r = 0; r < rows; ++r) {
        T* row = py + r * outF;
        for (int64_t j = 0; j < outF; ++j) row[j] += pb[j];
      }
    }
  });
  if (anyRequiresGrad({&x, &w, &bias})) {
    Tensor sx = w.requiresGrad() ? x.detach() : Tensor();
    Tensor sw = x.requiresGrad() ? w.detach() : Tensor();
    const bool needBias = bias.requiresGrad();
    // gw and gbias go straight into the parameters' grad buffers when the engine offers them
    // (sinks), which saves a temporary and an accumulation pass per step.
    recordOp(y, "linear", {&x, &w, &bias},
             AccumulatingBackwardFn([sx, sw, needBias, rows, in, outF, xShape = x.shape()](
                                        const Tensor& g, const std::vector<Tensor>& sinks) {
               Tensor gx, gw, gb;
               dispatchFloat(g.dtype(), "linear backward", [&]<class T>() {
                 const T* pg = g.data<T>();
                 if (sw.defined()) {
                   gx = empty(xShape, g.dtype());
                   gemm<T>(false, false, rows, in, outF, pg, outF, sw.data<T>(), in, gx.data<T>(),
                           in, false);
                 }
                 if (sx.defined()) {
                   const bool sunk = sinks.size() > 1 && sinks[1].defined();
                   Tensor dst = sunk ? sinks[1] : empty({outF, in}, g.dtype());
                   gemm<T>(true, false, outF, in, rows, pg, outF, sx.data<T>(), in, dst.data<T>(),
                           in, sunk);
                   if (!sunk) gw = dst;
                 }
                 if (needBias) {
                   const bool sunk = sinks.size() > 2 && sinks[2].defined();
                   Tensor dst = sunk ? sinks[2] : zeros({outF}, g.dtype());
                   T* pb = dst.data<T>();
                   for (int64_t r = 0; r < rows; ++r) {
                     const T* row = pg + r * outF;
                     for (int64_t j = 0; j < outF; ++j) pb[j] += row[j];
                   }
                   if (!sunk) gb = dst;
                 }
               });
               return std::vector<Tensor>{gx, gw, gb};
             }));
  }
  return y;
}

}  // namespace

}  // namespace loom::ag
