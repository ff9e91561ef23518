// Weights on disk in the safetensors format, so they move to and from PyTorch and NumPy.
//
// File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
// ..., "__metadata__": {"key": "value"}} padded with spaces to a multiple of 8, then the raw
// little-endian, row-major tensor data (offsets relative to the end of the header).
// Supported dtypes: F32, F64, I64.
//
// Errors: std::runtime_error for I/O problems and malformed files (the message names the
// path, and the tensor where one is at fault); std::invalid_argument for caller mistakes,
// including a state dict that does not match the module (see nn::Module::loadStateDict).
#pragma once

#include <map>
#include <string>

#include "loom/autograd/nn.h"
#include "loom/autograd/tensor.h"

namespace loom::ag {

using nn::NamedTensors;

// Writes tensors in the given order (written to path.tmp, then renamed over path; a failure
// removes path.tmp and throws std::runtime_error naming the file and the cause).
void saveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata = {});
// Reads every tensor, in file (data offset) order.
NamedTensors loadSafetensors(const std::string& path,
                             std::map<std::string, std::string>* metadata = nullptr);

// module.stateDict() to a file, and back with loadStateDict (names, shapes and dtypes checked).
void saveStateDict(const nn::Module& module, const std::string& path);
void loadStateDict(nn::Module& module, const std::string& path, bool strict = true);

}  // namespace loom::ag
