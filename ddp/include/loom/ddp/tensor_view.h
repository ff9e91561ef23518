// Tensor <-> BufferView: how ddp/ hands autograd_lite's storage to the comm stack without
// copying. The view aliases the tensor's storage; keep the tensor alive until the Work that
// uses the view completes.
#pragma once

#include "loom/autograd/tensor.h"
#include "loom/comm/types.h"

namespace loom::ddp {

// float32 -> kFloat32, float64 -> kFloat64, int64 -> kInt64.
DType commDType(ag::DType dtype);
// A CPU view of the whole tensor (defined, contiguous by construction).
BufferView bufferView(ag::Tensor& tensor);

}  // namespace loom::ddp
