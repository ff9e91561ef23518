// Matrix ops (Eigen over the tensors' own storage, no copies), losses and layer functions.
#include <Eigen/Core>
#include <cmath>
#include <stdexcept>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag {

using detail::dispatchFloat;

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;

// A row-major [rows, cols] Eigen view of a tensor's storage.
template <class T>
Eigen::Map<RowMat<T>> mat(Tensor& t, int64_t rows, int64_t cols) {
  return Eigen::Map<RowMat<T>>(t.data<T>(), rows, cols);
}
template <class T>
Eigen::Map<const RowMat<T>> mat(const Tensor& t, int64_t rows, int64_t cols) {
  return Eigen::Map<const RowMat<T>>(t.data<T>(), rows, cols);
}
template <class T>
Eigen::Map<const RowVec<T>> rowVec(const Tensor& t) {
  return Eigen::Map<const RowVec<T>>(t.data<T>(), t.numel());
}
template <class T>
Eigen::Map<RowVec<T>> rowVec(Tensor& t) {
  return Eigen::Map<RowVec<T>>(t.data<T>(), t.numel());
}

std::string shapes(const Tensor& a, const Tensor& b) {
  return shapeToString(a.shape()) + " and " + shapeToString(b.shape());
}

}  // namespace

// a: [M, K], b: [K, N] -> [M, N]. Backward: ga = g b^T, gb = a^T g.
Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::checkDefined(a, "matmul", "a");
  detail::checkDefined(b, "matmul", "b");
  detail::checkSameDType(a, b, "matmul");
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0)) {
    throw std::invalid_argument("matmul: expected [M, K] @ [K, N], got " + shapes(a, b));
  }
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor out = empty({m, n}, a.dtype());
  dispatchFloat(a.dtype(), "matmul", [&]<class T>() {
    mat<T>(out, m, n).noalias() = mat<T>(a, m, k) * mat<T>(b, k, n);
  });
  if (anyRequiresGrad({&a, &b})) {
    Tensor sa = b.requiresGrad() ? a.detach() : Tensor();
    Tensor sb = a.requiresGrad() ? b.detach() : Tensor();
    recordOp(out, "matmul", {&a, &b}, [sa, sb, m, k, n](const Tensor& g) {
      Tensor ga, gb;
      dispatchFloat(g.dtype(), "matmul backward", [&]<class T>() {
        if (sb.defined()) {
          ga = empty({m, k}, g.dtype());
          mat<T>(ga, m, k).noalias() = mat<T>(g, m, n) * mat<T>(sb, k, n).transpose();
        }
        if (sa.defined()) {
          gb = empty({k, n}, g.dtype());
          mat<T>(gb, k, n).noalias() = mat<T>(sa, m, k).transpose() * mat<T>(g, m, n);
        }
      });
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

// a: [M, N] -> [N, M]. Backward: the gradient transposed back.
Tensor transpose(const Tensor& a) {
  detail::checkDefined(a, "transpose", "a");
  detail::checkDim(a, 2, "transpose", "a");
  const int64_t m = a.size(0), n = a.size(1);
  Tensor out = empty({n, m}, a.dtype());
  dispatchFloat(a.dtype(), "transpose",
                [&]<class T>() { mat<T>(out, n, m) = mat<T>(a, m, n).transpose(); });
  recordOp(out, "transpose", {&a},
           [](const Tensor& g) { return std::vector<Tensor>{transpose(g)}; });
  return out;
}

// x: [B, in], w: [out, in], bias: [out] -> y = x w^T + bias: [B, out].
// Backward: gx = g w, gw = g^T x, gbias = column sums of g.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  detail::checkDefined(x, "linear", "input");
  detail::checkDefined(w, "linear", "weight");
  detail::checkSameDType(x, w, "linear");
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1)) {
    throw std::invalid_argument("linear: expected input [B, in] and weight [out, in], got " +
                                shapes(x, w));
  }
  const int64_t batch = x.size(0), in = x.size(1), outF = w.size(0);
  if (bias.defined()) {
    detail::checkSameDType(x, bias, "linear");
    if (bias.shape() != Shape{outF}) {
      throw std::invalid_argument("linear: bias must have shape [" + std::to_string(outF) +
                                  "], got " + shapeToString(bias.shape()));
    }
  }
  Tensor y = empty({batch, outF}, x.dtype());
  dispatchFloat(x.dtype(), "linear", [&]<class T>() {
    auto ym = mat<T>(y, batch, outF);
    ym.noalias() = mat<T>(x, batch, in) * mat<T>(w, outF, in).transpose();
    if (bias.defined()) ym.rowwise() += rowVec<T>(bias);
  });
  if (anyRequiresGrad({&x, &w, &bias})) {
    Tensor sx = w.requiresGrad() ? x.detach() : Tensor();
    Tensor sw = x.requiresGrad() ? w.detach() : Tensor();
    const bool needBias = bias.requiresGrad();
    // gw and gbias go straight into the parameters' grad buffers when the engine offers them
    // (sinks), which saves a temporary and an accumulation pass per step.
    recordOp(y, "linear", {&x, &w, &bias},
             AccumulatingBackwardFn([sx, sw, needBias, batch, in, outF](
                                        const Tensor& g, const std::vector<Tensor>& sinks) {
               Tensor gx, gw, gb;
               dispatchFloat(g.dtype(), "linear backward", [&]<class T>() {
                 auto gm = mat<T>(g, batch, outF);
                 if (sw.defined()) {
                   gx = empty({batch, in}, g.dtype());
                   mat<T>(gx, batch, in).noalias() = gm * mat<T>(sw, outF, in);
                 }
                 if (sx.defined()) {
                   if (sinks.size() > 1 && sinks[1].defined()) {
                     Tensor sink = sinks[1];
                     mat<T>(sink, outF, in).noalias() += gm.transpose() * mat<T>(sx, batch, in);
                   } else {
                     gw = empty({outF, in}, g.dtype());
                     mat<T>(gw, outF, in).noalias() = gm.transpose() * mat<T>(sx, batch, in);
                   }
                 }
                 if (needBias) {
                   if (sinks.size() > 2 && sinks[2].defined()) {
                     Tensor sink = sinks[2];
                     rowVec<T>(sink) += gm.colwise().sum();
                   } else {
                     gb = empty({outF}, g.dtype());
                     rowVec<T>(gb) = gm.colwise().sum();
                   }
                 }
               });
               return std::vector<Tensor>{gx, gw, gb};
             }));
  }
  return y;
}

// logits: [N, C], labels: [N] int64 -> mean over n of -log softmax(logits)[n, labels[n]].
// Backward: (softmax(logits) - onehot(labels)) * g / N.
Tensor crossEntropy(const Tensor& logits, const Tensor& labels) {
  detail::checkDefined(logits, "crossEntropy", "logits");
  detail::checkDefined(labels, "crossEntropy", "labels");
  detail::checkDim(logits, 2, "crossEntropy", "logits");
  if (labels.dtype() != DType::kInt64) {
    throw std::invalid_argument(std::string("crossEntropy: labels must be int64, got ") +
                                dtypeName(labels.dtype()));
  }
  const int64_t n = logits.size(0), c = logits.size(1);
  if (labels.shape() != Shape{n}) {
    throw std::invalid_argument("crossEntropy: labels must have shape [" + std::to_string(n) +
                                "] to match logits " + shapeToString(logits.shape()) + ", got " +
                                shapeToString(labels.shape()));
  }
  if (n == 0) throw std::invalid_argument("crossEntropy: empty batch");
  const int64_t* py = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (py[i] < 0 || py[i] >= c) {
      throw std::invalid_argument("crossEntropy: labels[" + std::to_string(i) +
                                  "] = " + std::to_string(py[i]) + " is outside [0, " +
                                  std::to_string(c) + ")");
    }
  }
  Tensor probs = empty({n, c}, logits.dtype());
  Tensor out = empty({}, logits.dtype());
  dispatchFloat(logits.dtype(), "crossEntropy", [&]<class T>() {
    const T* px = logits.data<T>();
    T* pp = probs.data<T>();
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = px + i * c;
      T* prow = pp + i * c;
      T mx = row[0];
      for (int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
      T total = 0;
      for (int64_t j = 0; j < c; ++j) {
        prow[j] = std::exp(row[j] - mx);
        total += prow[j];
      }
      const T inv = T(1) / total;
      for (int64_t j = 0; j < c; ++j) prow[j] *= inv;
      loss -= static_cast<double>(row[py[i]] - mx - std::log(total));
    }
    *out.data<T>() = static_cast<T>(loss / static_cast<double>(n));
  });
  recordOp(out, "crossEntropy", {&logits, nullptr},
           [probs, labels = labels.detach(), n, c](const Tensor& g) {
             Tensor gx = probs;  // owned by this node; reused as the gradient buffer
             dispatchFloat(g.dtype(), "crossEntropy backward", [&]<class T>() {
               T* p = gx.data<T>();
               const int64_t* py = labels.data<int64_t>();
               const T scale = static_cast<T>(g.item() / static_cast<double>(n));
               for (int64_t i = 0; i < n; ++i) p[i * c + py[i]] -= T(1);
               for (int64_t i = 0; i < n * c; ++i) p[i] *= scale;
             });
             return std::vector<Tensor>{gx, Tensor()};
           });
  return out;
}

// mean((input - target)^2). Backward: 2 (input - target) g / n to input, its negation to target.
Tensor mseLoss(const Tensor& input, const Tensor& target) {
  detail::checkDefined(input, "mseLoss", "input");
  detail::checkDefined(target, "mseLoss", "target");
  detail::checkSameDType(input, target, "mseLoss");
  if (input.shape() != target.shape()) {
    throw std::invalid_argument("mseLoss: input and target shapes differ: " +
                                shapes(input, target));
  }
  const int64_t n = input.numel();
  Tensor diff = empty(input.shape(), input.dtype());
  Tensor out = empty({}, input.dtype());
  dispatchFloat(input.dtype(), "mseLoss", [&]<class T>() {
    const T* a = input.data<T>();
    const T* b = target.data<T>();
    T* d = diff.data<T>();
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      d[i] = a[i] - b[i];
      acc += static_cast<double>(d[i]) * d[i];
    }
    *out.data<T>() = static_cast<T>(n ? acc / static_cast<double>(n) : 0.0);
  });
  recordOp(out, "mseLoss", {&input, &target}, [diff, n](const Tensor& g) {
    Tensor ga = diff * (2.0 * g.item() / static_cast<double>(n));
    return std::vector<Tensor>{ga, neg(ga)};
  });
  return out;
}

// Backward: g times the same mask (0 or 1/(1-p)).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  detail::checkDefined(x, "dropout", "x");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw std::invalid_argument("dropout: p must be in [0, 1], got " + std::to_string(p));
  }
  if (!training || p == 0.0) return x;
  Tensor mask = empty(x.shape(), x.dtype());
  Tensor out = empty(x.shape(), x.dtype());
  dispatchFloat(x.dtype(), "dropout", [&]<class T>() {
    const T keepScale = p == 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - p));
    T* pm = mask.data<T>();
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      pm[i] = gen.uniform() < p ? T(0) : keepScale;
      po[i] = px[i] * pm[i];
    }
  });
  recordOp(out, "dropout", {&x},
           [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; });
  return out;
}

// x: [N, C]. xhat = (x - mean) * invstd; y = xhat * weight + bias.
// Backward (training, batch statistics):
//   gxhat = g * weight; gx = invstd / N * (N gxhat - sum_n gxhat - xhat sum_n(gxhat xhat));
// (eval, running statistics): gx = g * weight * invstd. gweight = sum_n g xhat; gbias = sum_n g.
Tensor batchNorm(const Tensor& x, const Tensor& runningMean, const Tensor& runningVar,
                 const Tensor& weight, const Tensor& bias, bool training, double momentum,
                 double eps) {
  detail::checkDefined(x, "batchNorm", "input");
  if (x.dim() != 2) {
    throw std::invalid_argument("batchNorm: expected input [N, C], got " +
                                shapeToString(x.shape()));
  }
  const int64_t n = x.size(0), c = x.size(1);
  auto checkVec = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    if (t.shape() != Shape{c} || t.dtype() != x.dtype()) {
      throw std::invalid_argument(std::string("batchNorm: ") + what + " must be [" +
                                  std::to_string(c) + "] " + dtypeName(x.dtype()) + ", got " +
                                  shapeToString(t.shape()) + " " + dtypeName(t.dtype()));
    }
  };
  checkVec(runningMean, "running_mean");
  checkVec(runningVar, "running_var");
  checkVec(weight, "weight");
  checkVec(bias, "bias");
  if (!training && (!runningMean.defined() || !runningVar.defined())) {
    throw std::invalid_argument("batchNorm: eval mode needs running_mean and running_var");
  }
  if (training && n <= 1) {
    throw std::invalid_argument(
        "batchNorm: training needs more than 1 value per channel, got input " +
        shapeToString(x.shape()));
  }
  Tensor xhat = empty({n, c}, x.dtype());
  Tensor invstd = empty({c}, x.dtype());
  Tensor y = empty({n, c}, x.dtype());
  dispatchFloat(x.dtype(), "batchNorm", [&]<class T>() {
    auto xm = mat<T>(x, n, c);
    auto xh = mat<T>(xhat, n, c);
    auto is = rowVec<T>(invstd);
    RowVec<T> mu;
    if (training) {
      mu = xm.colwise().sum() / static_cast<T>(n);
      xh = xm.rowwise() - mu;
      RowVec<T> var = xh.array().square().colwise().sum() / static_cast<T>(n);
      is = (var.array() + static_cast<T>(eps)).rsqrt();
      if (runningMean.defined()) {
        Tensor rm = runningMean, rv = runningVar;
        const T mom = static_cast<T>(momentum);
        rowVec<T>(rm) = (T(1) - mom) * rowVec<T>(rm) + mom * mu;
        rowVec<T>(rv) =
            (T(1) - mom) * rowVec<T>(rv) + mom * var * (static_cast<T>(n) / static_cast<T>(n - 1));
      }
    } else {
      mu = rowVec<T>(runningMean);
      xh = xm.rowwise() - mu;
      is = (rowVec<T>(runningVar).array() + static_cast<T>(eps)).rsqrt();
    }
    xh = xh.array().rowwise() * is.array();
    auto ym = mat<T>(y, n, c);
    if (weight.defined()) {
      ym = xh.array().rowwise() * rowVec<T>(weight).array();
    } else {
      ym = xh;
    }
    if (bias.defined()) ym.rowwise() += rowVec<T>(bias);
  });
  recordOp(y, "batchNorm", {&x, &weight, &bias},
           [xhat, invstd, w = weight.defined() ? weight.detach() : Tensor(), training, n, c,
            needW = weight.requiresGrad(), needB = bias.requiresGrad()](const Tensor& g) {
             Tensor gx = empty({n, c}, g.dtype()), gw, gb;
             dispatchFloat(g.dtype(), "batchNorm backward", [&]<class T>() {
               auto gm = mat<T>(g, n, c);
               auto xh = mat<T>(xhat, n, c);
               RowVec<T> sumG = gm.colwise().sum();
               RowVec<T> sumGXhat = (gm.array() * xh.array()).colwise().sum();
               if (needW) {
                 gw = empty({c}, g.dtype());
                 rowVec<T>(gw) = sumGXhat;
               }
               if (needB) {
                 gb = empty({c}, g.dtype());
                 rowVec<T>(gb) = sumG;
               }
               RowVec<T> scale = rowVec<T>(invstd);
               if (w.defined()) scale = scale.array() * rowVec<T>(w).array();
               auto gxm = mat<T>(gx, n, c);
               if (training) {
                 // gxhat = g * w; sums over n of gxhat are w * sumG and w * sumGXhat.
                 const T invN = T(1) / static_cast<T>(n);
                 gxm = (gm.array().rowwise() - sumG.array() * invN) -
                       (xh.array().rowwise() * (sumGXhat.array() * invN));
                 gxm = gxm.array().rowwise() * scale.array();
               } else {
                 gxm = gm.array().rowwise() * scale.array();
               }
             });
             return std::vector<Tensor>{gx, gw, gb};
           });
  return y;
}

// out[idx..., :] = weight[indices[idx...], :]. Backward: rows of g scatter-added into gweight.
Tensor embedding(const Tensor& weight, const Tensor& indices) {
  detail::checkDefined(weight, "embedding", "weight");
  detail::checkDefined(indices, "embedding", "indices");
  detail::checkDim(weight, 2, "embedding", "weight");
  if (indices.dtype() != DType::kInt64) {
    throw std::invalid_argument(std::string("embedding: indices must be int64, got ") +
                                dtypeName(indices.dtype()));
  }
  const int64_t v = weight.size(0), d = weight.size(1), count = indices.numel();
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    if (idx[i] < 0 || idx[i] >= v) {
      throw std::invalid_argument("embedding: indices[" + std::to_string(i) +
                                  "] = " + std::to_string(idx[i]) + " is outside [0, " +
                                  std::to_string(v) + ")");
    }
  }
  Shape outShape = indices.shape();
  outShape.push_back(d);
  Tensor out = empty(outShape, weight.dtype());
  dispatchFloat(weight.dtype(), "embedding", [&]<class T>() {
    const T* pw = weight.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < count; ++i) std::copy_n(pw + idx[i] * d, d, po + i * d);
  });
  recordOp(out, "embedding", {&weight, nullptr},
           [ind = indices.detach(), v, d, count](const Tensor& g) {
             Tensor gw = zeros({v, d}, g.dtype());
             dispatchFloat(g.dtype(), "embedding backward", [&]<class T>() {
               const T* pg = g.data<T>();
               T* pw = gw.data<T>();
               const int64_t* idx = ind.data<int64_t>();
               for (int64_t i = 0; i < count; ++i) {
                 T* row = pw + idx[i] * d;
                 for (int64_t j = 0; j < d; ++j) row[j] += pg[i * d + j];
               }
             });
             return std::vector<Tensor>{gw, Tensor()};
           });
  return out;
}

}  // namespace loom::ag
