// Shape ops: view/flatten (storage shared), transpose/permute/slice/cat/split (copies), and
// the causal mask of attention scores.
//
// slice and cat view a tensor as [outer, size, inner] around `dim`: element (o, s, i) sits at
// (o * size + s) * inner + i, so a slice or a piece of a concatenation is, for each o, one
// contiguous run of (count * inner) elements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <type_traits>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {

using detail::dispatchFloat;
using detail::kElementwiseGrain;

Tensor view(const Tensor& x, const Shape& shape) {
  detail::checkDefined(x, "view", "x");
  return x.reshape(shape);
}

Tensor flatten(const Tensor& x, int64_t startDim, int64_t endDim) {
  detail::checkDefined(x, "flatten", "x");
  if (x.dim() == 0) return x.reshape({1});
  const int64_t s = detail::wrapDim(startDim, x.dim(), "flatten");
  const int64_t e = detail::wrapDim(endDim, x.dim(), "flatten");
  if (s > e) {
    throw std::invalid_argument("flatten: startDim " + std::to_string(startDim) +
                                " comes after endDim " + std::to_string(endDim) + " for shape " +
                                shapeToString(x.shape()));
  }
  Shape out(x.shape().begin(), x.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= x.size(d);
  out.push_back(merged);
  out.insert(out.end(), x.shape().begin() + e + 1, x.shape().end());
  return x.reshape(out);
}

namespace {

// out[j...] = x[j permuted]: walks out in row-major order with x's strides permuted.
template <class T>
void permuteCopy(const T* px, T* po, const Shape& inShape, const std::vector<int64_t>& dims) {
  const size_t rank = inShape.size();
  std::vector<int64_t> inStride(rank, 1);
  for (size_t d = rank; d-- > 1;) inStride[d - 1] = inStride[d] * inShape[d];
  Shape outShape(rank);
  std::vector<int64_t> stride(rank);
  for (size_t i = 0; i < rank; ++i) {
    outShape[i] = inShape[dims[i]];
    stride[i] = inStride[dims[i]];
  }
  const int64_t n = shapeNumel(inShape);
  if (n == 0) return;
  if (rank == 0) {
    po[0] = px[0];
    return;
  }
  // The innermost output dimension is a strided run; an odometer walks the rest. Rows (runs)
  // split over the thread pool, each range starting its odometer at its first row.
  const int64_t inner = outShape[rank - 1], innerStride = stride[rank - 1];
  const int64_t rows = n / inner;
  parallelFor(rows, std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> index(rank, 0);
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 2, rest = r0; d >= 0; --d) {
      index[d] = rest % outShape[d];
      rest /= outShape[d];
      off += index[d] * stride[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* src = px + off;
      T* dst = po + r * inner;
      for (int64_t j = 0; j < inner; ++j) dst[j] = src[j * innerStride];
      for (size_t d = rank - 1; d-- > 0;) {
        ++index[d];
        off += stride[d];
        if (index[d] < outShape[d]) break;
        off -= stride[d] * outShape[d];
        index[d] = 0;
      }
    }
  });
}

}  // namespace

// out.shape[i] = x.shape[dims[i]]. Backward: g permuted by the inverse permutation.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::checkDefined(x, "permute", "x");
  const int64_t rank = x.dim();
  std::vector<int64_t> d(dims.size());
  std::vector<bool> seen(rank, false);
  auto bad = [&]() {
    std::string list;
    for (int64_t v : dims) list += (list.empty() ? "" : ", ") + std::to_string(v);
    return std::invalid_argument("permute: dims (" + list + ") are not a permutation of 0.." +
                                 std::to_string(rank - 1) + " for shape " +
                                 shapeToString(x.shape()));
  };
  if (static_cast<int64_t>(dims.size()) != rank) throw bad();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < -rank || dims[i] >= rank) throw bad();
    d[i] = dims[i] < 0 ? dims[i] + rank : dims[i];
    if (seen[d[i]]) throw bad();
    seen[d[i]] = true;
  }
  Shape outShape(rank);
  for (int64_t i = 0; i < rank; ++i) outShape[i] = x.size(d[i]);
  Tensor out = empty(outShape, x.dtype());
  detail::dispatchAny(x.dtype(),
                      [&]<class T>() { permuteCopy(x.data<T>(), out.data<T>(), x.shape(), d); });
  if (anyRequiresGrad({&x})) {
    std::vector<int64_t> inverse(rank);
    for (int64_t i = 0; i < rank; ++i) inverse[d[i]] = i;
    recordOp(out, "permute", {&x},
             [inverse](const Tensor& g) { return std::vector<Tensor>{permute(g, inverse)}; });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::checkDefined(x, "transpose", "x");
  const int64_t a = detail::wrapDim(d0, x.dim(), "transpose");
  const int64_t b = detail::wrapDim(d1, x.dim(), "transpose");
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

namespace {

// Copies `count` positions along the split axis, for every outer index, between a tensor with
// `fromSize` positions (starting at fromStart, stepping fromStep) and one with `toSize`
// (starting at toStart, contiguous). With add, accumulates instead of copying.
template <class T>
void axisCopy(const T* from, int64_t fromSize, int64_t fromStart, int64_t fromStep, T* to,
              int64_t toSize, int64_t toStart, int64_t count, int64_t outer, int64_t inner,
              bool add) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < count; ++c) {
      const T* src = from + ((o * fromSize) + fromStart + c * fromStep) * inner;
      T* dst = to + ((o * toSize) + toStart + c) * inner;
      if (add) {
        for (int64_t i = 0; i < inner; ++i) {
          if constexpr (std::is_same_v<T, BFloat16>) {
            dst[i] = toBFloat16(toFloat(dst[i]) + toFloat(src[i]));
          } else if constexpr (std::is_same_v<T, Float16>) {
            dst[i] = toFloat16(toFloat(dst[i]) + toFloat(src[i]));
          } else {
            dst[i] += src[i];
          }
        }
      } else {
        std::memcpy(dst, src, static_cast<size_t>(inner) * sizeof(T));
      }
    }
  }
}

}  // namespace

// x: [..., size, ...] -> [..., count, ...] along dim. Backward: g scattered into zeros at the
// selected positions.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  detail::checkDefined(x, "slice", "x");
  const int64_t d = detail::wrapDim(dim, x.dim(), "slice");
  if (step < 1) {
    throw std::invalid_argument("slice: step must be >= 1, got " + std::to_string(step));
  }
  const int64_t size = x.size(d);
  auto clampIndex = [size](int64_t i) {
    if (i < 0) i += size;
    return std::clamp<int64_t>(i, 0, size);
  };
  const int64_t s = clampIndex(start), e = std::max(clampIndex(end), s);
  const int64_t count = (e - s + step - 1) / step;
  Shape outShape = x.shape();
  outShape[d] = count;
  Tensor out = empty(outShape, x.dtype());
  const detail::AxisSplit ax = detail::splitAxis(x.shape(), d);
  detail::dispatchAny(x.dtype(), [&]<class T>() {
    axisCopy(x.data<T>(), size, s, step, out.data<T>(), count, 0, count, ax.outer, ax.inner, false);
  });
  if (anyRequiresGrad({&x})) {
    recordOp(out, "slice", {&x}, [inShape = x.shape(), ax, s, step, count](const Tensor& g) {
      Tensor gx = zeros(inShape, g.dtype());
      detail::dispatchAny(g.dtype(), [&]<class T>() {
        // Inverse of the forward copy: position c of g goes to s + c * step of gx.
        const T* pg = g.data<T>();
        T* px = gx.data<T>();
        for (int64_t o = 0; o < ax.outer; ++o) {
          for (int64_t c = 0; c < count; ++c) {
            std::memcpy(px + (o * ax.size + s + c * step) * ax.inner,
                        pg + (o * count + c) * ax.inner, static_cast<size_t>(ax.inner) * sizeof(T));
          }
        }
      });
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

// Backward: input i gets the slice of g it occupied.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) throw std::invalid_argument("cat: expected at least one tensor, got none");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      throw std::invalid_argument("cat: tensor " + std::to_string(i) + " is undefined");
    }
  }
  const Tensor& first = tensors[0];
  const int64_t d = detail::wrapDim(dim, first.dim(), "cat");
  Shape outShape = first.shape();
  outShape[d] = 0;
  std::vector<int64_t> starts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::checkSameDType(first, t, "cat");
    Shape a = first.shape(), b = t.shape();
    if (a.size() == b.size()) a[d] = b[d] = 0;
    if (a != b) {
      throw std::invalid_argument("cat: tensor " + std::to_string(i) + " has shape " +
                                  shapeToString(t.shape()) + ", expected " +
                                  shapeToString(first.shape()) + " except along dim " +
                                  std::to_string(dim));
    }
    starts.push_back(outShape[d]);
    outShape[d] += t.size(d);
  }
  Tensor out = empty(outShape, first.dtype());
  const detail::AxisSplit ax = detail::splitAxis(outShape, d);
  detail::dispatchAny(first.dtype(), [&]<class T>() {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t size = tensors[i].size(d);
      axisCopy(tensors[i].data<T>(), size, 0, 1, out.data<T>(), ax.size, starts[i], size, ax.outer,
               ax.inner, false);
    }
  });
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : tensors) inputs.push_back(&t);
  if (gradEnabled() && std::any_of(tensors.begin(), tensors.end(),
                                   [](const Tensor& t) { return t.requiresGrad(); })) {
    std::vector<int64_t> sizes;
    for (const Tensor& t : tensors) sizes.push_back(t.size(d));
    recordOp(out, "cat", inputs, [d, starts, sizes](const Tensor& g) {
      std::vector<Tensor> grads;
      for (size_t i = 0; i < sizes.size(); ++i) {
        grads.push_back(slice(g, d, starts[i], starts[i] + sizes[i]));
      }
      return grads;
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t splitSize, int64_t dim) {
  detail::checkDefined(x, "split", "x");
  const int64_t d = detail::wrapDim(dim, x.dim(), "split");
  if (splitSize < 1) {
    throw std::invalid_argument("split: splitSize must be >= 1, got " + std::to_string(splitSize));
  }
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < x.size(d); s += splitSize) {
    sizes.push_back(std::min(splitSize, x.size(d) - s));
  }
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, dim);
}

// Each piece is a slice (its own node), so each piece's gradient flows back on its own.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  detail::checkDefined(x, "split", "x");
  const int64_t d = detail::wrapDim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw std::invalid_argument("split: negative size " + std::to_string(s));
    total += s;
  }
  if (total != x.size(d)) {
    std::string list;
    for (int64_t s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw std::invalid_argument("split: sizes (" + list + ") add up to " + std::to_string(total) +
                                ", expected " + std::to_string(x.size(d)) + " (dim " +
                                std::to_string(dim) + " of " + shapeToString(x.shape()) + ")");
  }
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, d, start, start + s));
    start += s;
  }
  return out;
}

// x: [..., T, S]; filled where s > t + (S - T). Backward: g with the same positions zeroed.
Tensor causalMask(const Tensor& x, double value) {
  detail::checkDefined(x, "causalMask", "x");
  if (detail::isLow(x)) return cast(causalMask(detail::upcastLow(x), value), x.dtype());
  if (x.dim() < 2 || x.size(-1) < x.size(-2)) {
    throw std::invalid_argument("causalMask: expected scores [..., T, S] with S >= T, got " +
                                shapeToString(x.shape()));
  }
  const int64_t t = x.size(-2), s = x.size(-1);
  const int64_t mats = t * s == 0 ? 0 : x.numel() / (t * s);
  auto apply = [t, s, mats](const Tensor& src, double fill, const char* op) {
    Tensor out = empty(src.shape(), src.dtype());
    dispatchFloat(src.dtype(), op, [&]<class T>() {
      const T* p = src.data<T>();
      T* o = out.data<T>();
      const T f = static_cast<T>(fill);
      for (int64_t m = 0; m < mats; ++m) {
        for (int64_t i = 0; i < t; ++i) {
          const int64_t row = (m * t + i) * s;
          const int64_t visible = i + (s - t) + 1;
          std::copy_n(p + row, visible, o + row);
          std::fill(o + row + visible, o + row + s, f);
        }
      }
    });
    return out;
  };
  Tensor out = apply(x, value, "causalMask");
  recordOp(out, "causalMask", {&x}, [apply](const Tensor& g) {
    return std::vector<Tensor>{apply(g, 0.0, "causalMask backward")};
  });
  return out;
}

}  // namespace loom::ag
