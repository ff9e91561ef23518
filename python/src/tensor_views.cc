#include "tensor_views.h"

#include <optional>
#include <string>

#include "loom/common/error.h"

namespace loom::torch_backend {

namespace {

// Loom's dtype for a torch scalar type; none for the types Loom has no kernels for.
std::optional<DType> loomDtypeOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kChar:
      return DType::kInt8;
    case at::kByte:
      return DType::kUInt8;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

}  // namespace

DType toLoomDtype(at::ScalarType type, const char* opName) {
  if (const std::optional<DType> dtype = loomDtypeOf(type)) return *dtype;
  LOOM_THROW(InvalidArgumentError, opName, ": the loom backend does not support dtype ",
             c10::toString(type),
             " (float, double, half, bfloat16, int8, uint8, int32, int64, bool)");
}

void checkTensor(const at::Tensor& t, const char* opName, bool anyDtype) {
  if (!t.defined()) {
    LOOM_THROW(InvalidArgumentError, opName, ": undefined tensor");
  }
  if (!t.device().is_cpu()) {
    LOOM_THROW(InvalidArgumentError, opName, ": ", t.device().str(),
               " tensors are not supported by the loom backend (CPU tensors only; use the nccl "
               "backend for CUDA tensors)");
  }
  if (t.layout() != at::kStrided) {
    LOOM_THROW(InvalidArgumentError, opName,
               ": the loom backend takes dense (strided) tensors, got layout ", t.layout());
  }
  if (!anyDtype) toLoomDtype(t.scalar_type(), opName);
}

BufferView bufferView(const at::Tensor& t, const char* opName) {
  checkTensor(t, opName);
  LOOM_CHECK(t.is_contiguous(), opName, ": expected a contiguous tensor");
  return BufferView{t.data_ptr(), static_cast<size_t>(t.numel()),
                    toLoomDtype(t.scalar_type(), opName), Device::cpu()};
}

namespace {

// True when the tensors are contiguous and lie end to end in one storage, in list order.
bool endToEnd(const std::vector<at::Tensor>& tensors) {
  const auto* next = static_cast<const char*>(tensors.front().data_ptr());
  for (const at::Tensor& t : tensors) {
    if (!t.is_contiguous() || t.data_ptr() != next ||
        !t.storage().is_alias_of(tensors.front().storage())) {
      return false;
    }
    next += t.numel() * t.element_size();
  }
  return true;
}

}  // namespace

Staged::Staged(std::vector<at::Tensor> tensors, const char* opName, bool bytes)
    : tensors_(std::move(tensors)) {
  LOOM_CHECK(!tensors_.empty(), opName, ": empty tensor list");
  size_t count = 0;
  for (const at::Tensor& t : tensors_) {
    checkTensor(t, opName, bytes);
    if (t.scalar_type() != tensors_.front().scalar_type()) {
      LOOM_THROW(InvalidArgumentError, opName, ": tensors of one list must share a dtype, got ",
                 c10::toString(tensors_.front().scalar_type()), " and ",
                 c10::toString(t.scalar_type()));
    }
    count += static_cast<size_t>(t.numel());
  }
  const at::ScalarType type = tensors_.front().scalar_type();
  DType dtype = DType::kUInt8;
  size_t elements = count;
  if (bytes && !loomDtypeOf(type)) {
    elements = count * tensors_.front().element_size();
  } else {
    dtype = toLoomDtype(type, opName);
  }
  if (endToEnd(tensors_)) {
    view_ = BufferView{tensors_.front().data_ptr(), elements, dtype, Device::cpu()};
    return;
  }
  staging_ = at::empty({static_cast<int64_t>(count)}, tensors_.front().options());
  view_ = BufferView{staging_.data_ptr(), elements, dtype, Device::cpu()};
}

void Staged::copyIn() {
  if (!staging_.defined()) return;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors_) {
    staging_.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
    offset += t.numel();
  }
}

void Staged::copyOut() {
  if (!staging_.defined()) return;
  int64_t offset = 0;
  for (at::Tensor& t : tensors_) {
    t.copy_(staging_.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

void Staged::scale(double factor) {
  if (!staging_.defined()) {
    staging_ = at::empty({static_cast<int64_t>(view_.count)}, tensors_.front().options());
    copyIn();
    view_.data = staging_.data_ptr();
  }
  staging_.mul_(factor);
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* opName) {
  if (tensors.size() != 1) {
    LOOM_THROW(InvalidArgumentError, opName,
               ": the loom backend takes one tensor per process (CPU), got ", tensors.size());
  }
  return tensors.front();
}

}  // namespace loom::torch_backend
