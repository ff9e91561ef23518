// The size in bytes of a C-order array, checked: the loaders of outside files (safetensors,
// .npy) compare what a file declares with what it holds before they allocate.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/autograd/tensor.h"

namespace loom::ag {

// The bytes an array of `shape` and `elementBytes`-byte elements holds; false when the count
// does not fit in 64 bits (a negative extent reads as a huge one, so it fails too, or is caught
// by the caller's comparison with the file's size).
inline bool shapeBytes(const Shape& shape, size_t elementBytes, uint64_t& out) {
  uint64_t n = elementBytes;
  for (int64_t d : shape) {
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return false;
    n *= u;
  }
  out = n;
  return true;
}

}  // namespace loom::ag
