#include "loom/ddp/tensor_view.h"

#include "loom/common/error.h"

namespace loom::ddp {

DType commDType(ag::DType dtype) {
  switch (dtype) {
    case ag::DType::kFloat32:
      return DType::kFloat32;
    case ag::DType::kFloat64:
      return DType::kFloat64;
    case ag::DType::kInt64:
      return DType::kInt64;
    case ag::DType::kBFloat16:
      return DType::kBFloat16;
    case ag::DType::kFloat16:
      return DType::kFloat16;
  }
  LOOM_THROW(InvalidArgumentError, "unknown autograd dtype ", static_cast<int>(dtype));
}

BufferView bufferView(ag::Tensor& tensor) {
  LOOM_CHECK(tensor.defined(), "bufferView of an undefined tensor");
  return BufferView{tensor.rawData(), static_cast<size_t>(tensor.numel()),
                    commDType(tensor.dtype()), Device::cpu()};
}

}  // namespace loom::ddp
