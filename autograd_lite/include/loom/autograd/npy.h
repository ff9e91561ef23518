// NumPy .npy files (format versions 1.0, 2.0 and 3.0) for datasets.
//
// Supported: little-endian float32 ('<f4'), float64 ('<f8'), int64 ('<i8') and
// float16 ('<f2'), C order (.npy has no bfloat16).
// Anything else (big-endian, Fortran order, other dtypes, truncated data) throws
// std::runtime_error naming the path and what was found versus what is supported.
#pragma once

#include <string>

#include "loom/autograd/tensor.h"

namespace loom::ag {

Tensor loadNpy(const std::string& path);
// Writes a version 1.0 file.
void saveNpy(const std::string& path, const Tensor& tensor);

}  // namespace loom::ag
