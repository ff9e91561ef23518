// Convolution and pooling over NCHW tensors.
//
// How conv2d works (im2col): for image n, `cols` [C*KH*KW, HO*WO] holds in row (c, kh, kw)
// and column (oh, ow) the input pixel that kernel tap (kh, kw) of channel c sees at output
// position (oh, ow) (zero where it falls in the padding). The convolution is then one matrix
// product per image, out[n] [O, HO*WO] = weight [O, C*KH*KW] @ cols[n]. Backward:
// gweight = sum_n g[n] cols[n]^T; gcols[n] = weight^T g[n], which col2im adds back onto the
// pixels each column came from; gbias = sum of g over n, oh, ow.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "gemm.h"
#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {

using detail::dispatchFloat;

namespace {

struct Geometry {
  int64_t n, c, h, w;      // input
  int64_t kh, kw;          // window
  int64_t sh, sw, ph, pw;  // stride, padding
  int64_t ho, wo;          // output
};

Geometry geometry(const Tensor& x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                  int64_t pw, const char* op) {
  if (x.dim() != 4) {
    throw std::invalid_argument(std::string(op) + ": expected input [N, C, H, W], got " +
                                shapeToString(x.shape()));
  }
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0) {
    throw std::invalid_argument(std::string(op) + ": kernel (" + std::to_string(kh) + ", " +
                                std::to_string(kw) + ") and stride (" + std::to_string(sh) + ", " +
                                std::to_string(sw) + ") must be >= 1, padding (" +
                                std::to_string(ph) + ", " + std::to_string(pw) + ") >= 0");
  }
  Geometry g{x.size(0), x.size(1), x.size(2), x.size(3), kh, kw, sh, sw, ph, pw, 0, 0};
  if (g.h + 2 * ph < kh || g.w + 2 * pw < kw) {
    throw std::invalid_argument(std::string(op) + ": kernel (" + std::to_string(kh) + ", " +
                                std::to_string(kw) + ") is larger than the padded input (" +
                                std::to_string(g.h + 2 * ph) + ", " + std::to_string(g.w + 2 * pw) +
                                ") of " + shapeToString(x.shape()));
  }
  g.ho = (g.h + 2 * ph - kh) / sh + 1;
  g.wo = (g.w + 2 * pw - kw) / sw + 1;
  return g;
}

// cols [C*KH*KW, HO*WO] from one image [C, H, W].
template <class T>
void im2col(const T* img, const Geometry& g, T* cols) {
  const int64_t l = g.ho * g.wo;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = cols + ((c * g.kh + i) * g.kw + j) * l;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i;
          T* dst = row + oh * g.wo;
          if (ih < 0 || ih >= g.h) {
            std::fill_n(dst, g.wo, T(0));
            continue;
          }
          const T* src = img + (c * g.h + ih) * g.w;
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j;
            dst[ow] = iw >= 0 && iw < g.w ? src[iw] : T(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds each column entry back onto its pixel of img [C, H, W].
template <class T>
void col2im(const T* cols, const Geometry& g, T* img) {
  const int64_t l = g.ho * g.wo;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * l;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) continue;
          T* dst = img + (c * g.h + ih) * g.w;
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j;
            if (iw >= 0 && iw < g.w) dst[iw] += row[oh * g.wo + ow];
          }
        }
      }
    }
  }
}

}  // namespace

// x: [N, C, H, W], weight: [O, C, KH, KW], bias: [O] -> [N, O, HO, WO] (see the file comment).
namespace {
Tensor conv2dImpl(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Conv2dParams& params);
}  // namespace

// Autocast casts the operands to its dtype; low-precision operands are convolved as float32
// and the output rounded once (autocast.h).
Tensor conv2d(const Tensor& x0, const Tensor& weight0, const Tensor& bias0,
              const Conv2dParams& params) {
  detail::checkDefined(x0, "conv2d", "input");
  detail::checkDefined(weight0, "conv2d", "weight");
  const Tensor x = detail::autocastLow(x0), weight = detail::autocastLow(weight0);
  const Tensor bias = detail::autocastLow(bias0);
  if (detail::anyLowPrecision({&x, &weight, &bias})) {
    detail::checkSameDType(x, weight, "conv2d");
    if (bias.defined()) detail::checkSameDType(x, bias, "conv2d");
    return cast(conv2dImpl(detail::upcastLow(x), detail::upcastLow(weight), detail::upcastLow(bias),
                           params),
                x.dtype());
  }
  return conv2dImpl(x, weight, bias, params);
}

namespace {

Tensor conv2dImpl(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Conv2dParams& params) {
  detail::checkSameDType(x, weight, "conv2d");
  if (weight.dim() != 4 || x.dim() != 4 || weight.size(1) != x.size(1)) {
    throw std::invalid_argument(
        "conv2d: expected input [N, C, H, W] and weight [O, C, KH, KW] with the same C, got " +
        shapeToString(x.shape()) + " and " + shapeToString(weight.shape()));
  }
  const Geometry g = geometry(x, weight.size(2), weight.size(3), params.strideH, params.strideW,
                              params.padH, params.padW, "conv2d");
  const int64_t o = weight.size(0);
  if (bias.defined()) {
    detail::checkSameDType(x, bias, "conv2d");
    if (bias.shape() != Shape{o}) {
      throw std::invalid_argument("conv2d: bias must have shape [" + std::to_string(o) + "], got " +
                                  shapeToString(bias.shape()));
    }
  }
  const int64_t l = g.ho * g.wo, ckk = g.c * g.kh * g.kw;
  Tensor cols = empty({g.n, ckk, l}, x.dtype());
  Tensor out = empty({g.n, o, g.ho, g.wo}, x.dtype());
  dispatchFloat(x.dtype(), "conv2d", [&]<class T>() {
    const T* px = x.data<T>();
    T* pc = cols.data<T>();
    parallelFor(g.n, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) im2col(px + n * g.c * g.h * g.w, g, pc + n * ckk * l);
    });
    T* po = out.data<T>();
    detail::gemmBatched<T>(g.n, false, false, o, l, ckk, weight.data<T>(), ckk, 0, pc, l, ckk * l,
                           po, l, o * l, false);
    if (bias.defined()) {
      const T* pb = bias.data<T>();
      for (int64_t n = 0; n < g.n; ++n) {
        for (int64_t k = 0; k < o; ++k) {
          T* plane = po + (n * o + k) * l;
          for (int64_t i = 0; i < l; ++i) plane[i] += pb[k];
        }
      }
    }
  });
  if (anyRequiresGrad({&x, &weight, &bias})) {
    recordOp(out, "conv2d", {&x, &weight, &bias},
             [cols = weight.requiresGrad() ? cols : Tensor(),
              w = x.requiresGrad() ? weight.detach() : Tensor(), g, o, l, ckk,
              needBias = bias.requiresGrad(), xShape = x.shape(),
              wShape = weight.shape()](const Tensor& grad) {
               Tensor gx, gw, gb;
               dispatchFloat(grad.dtype(), "conv2d backward", [&]<class T>() {
                 const T* pg = grad.data<T>();
                 if (cols.defined()) {  // gw = sum_n g[n] cols[n]^T
                   gw = zeros(wShape, grad.dtype());
                   detail::gemmBatched<T>(g.n, false, true, o, ckk, l, pg, l, o * l, cols.data<T>(),
                                          l, ckk * l, gw.data<T>(), ckk, 0, true);
                 }
                 if (w.defined()) {  // gcols[n] = w^T g[n], then col2im
                   Tensor gcols = empty({g.n, ckk, l}, grad.dtype());
                   T* pgc = gcols.data<T>();
                   detail::gemmBatched<T>(g.n, true, false, ckk, l, o, w.data<T>(), ckk, 0, pg, l,
                                          o * l, pgc, l, ckk * l, false);
                   gx = zeros(xShape, grad.dtype());
                   T* pgx = gx.data<T>();
                   parallelFor(g.n, 1, [&](int64_t n0, int64_t n1) {
                     for (int64_t n = n0; n < n1; ++n) {
                       col2im(pgc + n * ckk * l, g, pgx + n * g.c * g.h * g.w);
                     }
                   });
                 }
                 if (needBias) {
                   gb = zeros({o}, grad.dtype());
                   T* pb = gb.data<T>();
                   for (int64_t n = 0; n < g.n; ++n) {
                     for (int64_t k = 0; k < o; ++k) {
                       const T* plane = pg + (n * o + k) * l;
                       T acc = 0;
                       for (int64_t i = 0; i < l; ++i) acc += plane[i];
                       pb[k] += acc;
                     }
                   }
                 }
               });
               return std::vector<Tensor>{gx, gw, gb};
             });
  }
  return out;
}

Geometry poolGeometry(const Tensor& x, const Pool2dParams& p, const char* op) {
  detail::checkDefined(x, op, "input");
  const Geometry g = geometry(x, p.kernelH, p.kernelW, p.strideH, p.strideW, p.padH, p.padW, op);
  if (2 * p.padH > p.kernelH || 2 * p.padW > p.kernelW) {
    throw std::invalid_argument(std::string(op) + ": padding (" + std::to_string(p.padH) + ", " +
                                std::to_string(p.padW) + ") must be at most half the kernel (" +
                                std::to_string(p.kernelH) + ", " + std::to_string(p.kernelW) + ")");
  }
  return g;
}

}  // namespace

// Each output is the max of its window's in-bounds pixels. Backward: g goes to the pixel that
// won (the first maximum in row-major window order).
Tensor maxPool2d(const Tensor& x, const Pool2dParams& params) {
  if (detail::isLow(x)) return cast(maxPool2d(detail::upcastLow(x), params), x.dtype());
  const Geometry g = poolGeometry(x, params, "maxPool2d");
  const int64_t planes = g.n * g.c, l = g.ho * g.wo;
  Tensor out = empty({g.n, g.c, g.ho, g.wo}, x.dtype());
  Tensor argmax = empty({planes, l}, DType::kInt64);  // offset within the input plane
  dispatchFloat(x.dtype(), "maxPool2d", [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int64_t* pa = argmax.data<int64_t>();
    parallelFor(planes, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const T* plane = px + p * g.h * g.w;
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          for (int64_t ow = 0; ow < g.wo; ++ow) {
            T best = -std::numeric_limits<T>::infinity();
            int64_t where = -1;
            for (int64_t i = 0; i < g.kh; ++i) {
              const int64_t ih = oh * g.sh - g.ph + i;
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iw = ow * g.sw - g.pw + j;
                if (iw < 0 || iw >= g.w) continue;
                const T v = plane[ih * g.w + iw];
                // NaN propagates, as in PyTorch.
                if (where < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                  best = v;
                  where = ih * g.w + iw;
                }
              }
            }
            po[p * l + oh * g.wo + ow] = best;
            pa[p * l + oh * g.wo + ow] = where;
          }
        }
      }
    });
  });
  recordOp(out, "maxPool2d", {&x}, [argmax, g, planes, l, xShape = x.shape()](const Tensor& grad) {
    Tensor gx = zeros(xShape, grad.dtype());
    dispatchFloat(grad.dtype(), "maxPool2d backward", [&]<class T>() {
      const T* pg = grad.data<T>();
      const int64_t* pa = argmax.data<int64_t>();
      T* px = gx.data<T>();
      parallelFor(planes, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          T* plane = px + p * g.h * g.w;
          for (int64_t i = 0; i < l; ++i) plane[pa[p * l + i]] += pg[p * l + i];
        }
      });
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

// Each output is the sum of its window's in-bounds pixels over kernelH * kernelW (padding
// counts as zeros). Backward: g / (kernelH * kernelW) to every in-bounds pixel of the window.
Tensor avgPool2d(const Tensor& x, const Pool2dParams& params) {
  if (detail::isLow(x)) return cast(avgPool2d(detail::upcastLow(x), params), x.dtype());
  const Geometry g = poolGeometry(x, params, "avgPool2d");
  const int64_t planes = g.n * g.c, l = g.ho * g.wo;
  const double inv = 1.0 / static_cast<double>(g.kh * g.kw);
  Tensor out = empty({g.n, g.c, g.ho, g.wo}, x.dtype());
  // Calls f(outputIndex, inputOffset) for every in-bounds pixel of every window of plane p.
  auto windows = [g](int64_t p, auto&& f) {
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iw = ow * g.sw - g.pw + j;
            if (iw >= 0 && iw < g.w)
              f(p * g.ho * g.wo + oh * g.wo + ow, p * g.h * g.w + ih * g.w + iw);
          }
        }
      }
    }
  };
  dispatchFloat(x.dtype(), "avgPool2d", [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    std::fill_n(po, planes * l, T(0));
    parallelFor(planes, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) windows(p, [&](int64_t o, int64_t i) { po[o] += px[i]; });
      for (int64_t i = p0 * l; i < p1 * l; ++i) po[i] = static_cast<T>(po[i] * inv);
    });
  });
  recordOp(out, "avgPool2d", {&x}, [windows, planes, inv, xShape = x.shape()](const Tensor& grad) {
    Tensor gx = zeros(xShape, grad.dtype());
    dispatchFloat(grad.dtype(), "avgPool2d backward", [&]<class T>() {
      const T* pg = grad.data<T>();
      T* px = gx.data<T>();
      const T scale = static_cast<T>(inv);
      parallelFor(planes, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          windows(p, [&](int64_t o, int64_t i) { px[i] += pg[o] * scale; });
        }
      });
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

}  // namespace loom::ag
