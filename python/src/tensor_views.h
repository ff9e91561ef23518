// Tensors as Loom buffer views: the one place where at::Tensor meets loom::BufferView.
//
// Contract
// - bufferView(t) is the tensor's own storage (no copy): t must be a dense CPU tensor of a dtype
//   Loom has, and contiguous. Anything else is an InvalidArgumentError naming the operation and
//   what is wrong ("CUDA tensors are not supported by the loom backend: use nccl").
// - A Staged tensor is a contiguous stand-in for a tensor that is not contiguous (or a list of
//   tensors that must travel as one buffer): `view` is what goes to Loom; copyIn() fills it
//   before the operation, copyOut() writes the result back after it. When the tensors already
//   lie end to end in one storage (torch.chunk, torch.split of a contiguous tensor), nothing is
//   copied: `view` covers them in place.
// - Not thread-safe; each operation owns its Staged values until its Work finishes.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "loom/comm/types.h"

namespace loom::torch_backend {

DType toLoomDtype(at::ScalarType type, const char* opName);

// Throws unless `t` is a dense CPU tensor of a dtype Loom has (of any dtype with `anyDtype`:
// point-to-point moves bytes).
void checkTensor(const at::Tensor& t, const char* opName, bool anyDtype = false);
// Also requires `t` to be contiguous.
BufferView bufferView(const at::Tensor& t, const char* opName);

// A list of tensors (one tensor when the list has one element) as one contiguous buffer.
class Staged {
 public:
  Staged() = default;
  // Every tensor must have the same dtype; `opName` names the operation in errors. `bytes`
  // (send and recv): a dtype Loom has not (int16, uint16/32/64, float8, ...) travels as its
  // bytes, as gloo moves it; the dtypes Loom has keep their type, so that a mismatch is named.
  Staged(std::vector<at::Tensor> tensors, const char* opName, bool bytes = false);

  BufferView view() const { return view_; }
  bool copies() const { return staging_.defined(); }
  // Fills the staging buffer from the tensors (inputs); a no-op when nothing is staged.
  void copyIn();
  // Writes the staging buffer back into the tensors (outputs); a no-op when nothing is staged.
  void copyOut();
  // Multiplies the staged values by `factor` (PREMUL_SUM), after copyIn: when the view was the
  // tensors' own storage it becomes a staging copy first, so the caller's tensors keep their
  // values until copyOut.
  void scale(double factor);
  const std::vector<at::Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<at::Tensor> tensors_;
  at::Tensor staging_;  // undefined when view_ covers the tensors in place
  BufferView view_;
};

// The single tensor of a c10d argument list (CPU process groups take one tensor per process).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* opName);

}  // namespace loom::torch_backend
