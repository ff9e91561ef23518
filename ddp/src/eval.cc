#include "loom/ddp/eval.h"

#include <cstring>

#include "loom/common/error.h"
#include "loom/ddp/tensor_view.h"

namespace loom::ddp {

double reduceMean(ProcessGroup& pg, double value) {
  if (pg.size() == 1) return value;
  double sum = value;
  pg.allreduce(view(&sum, 1))->wait();
  return sum / pg.size();
}

void reduceMeanInPlace(ProcessGroup& pg, ag::Tensor& tensor) {
  const ag::DType dtype = tensor.dtype();
  LOOM_CHECK(ag::isFloatingPoint(dtype), "reduceMeanInPlace needs a floating-point tensor ",
             "(float32, float64, bfloat16 or float16), got ", ag::dtypeName(dtype));
  if (pg.size() == 1 || tensor.numel() == 0) return;
  if (dtype != ag::DType::kFloat32 && dtype != ag::DType::kFloat64) {
    // 16-bit floats: the comm layer's kernels sum and then divide by the world size once
    // (ReduceOp::kAvg), each step rounded to the tensor's own type.
    pg.allreduce(bufferView(tensor), {.reduceOp = ReduceOp::kAvg})->wait();
    return;
  }
  pg.allreduce(bufferView(tensor))->wait();
  const double scale = 1.0 / pg.size();
  if (dtype == ag::DType::kFloat32) {
    float* d = tensor.data<float>();
    for (int64_t i = 0; i < tensor.numel(); ++i) d[i] = static_cast<float>(d[i] * scale);
  } else {
    double* d = tensor.data<double>();
    for (int64_t i = 0; i < tensor.numel(); ++i) d[i] *= scale;
  }
}

ag::Tensor gatherInOrder(ProcessGroup& pg, const ag::Tensor& local, int64_t datasetSize) {
  LOOM_CHECK(local.defined() && local.dim() >= 1, "gatherInOrder needs a tensor [numSamples, ...]");
  const int64_t perRank = (datasetSize + pg.size() - 1) / pg.size();
  LOOM_CHECK_EQ(local.size(0), perRank, pg.who(),
                ": gatherInOrder expects numSamples rows of a SequentialDistributedSampler(",
                datasetSize, ", ", pg.size(), ")");
  ag::Shape shape = local.shape();
  shape[0] = perRank * pg.size();
  ag::Tensor all = ag::empty(shape, local.dtype());
  ag::Tensor in = local.detach();
  if (pg.size() == 1) {
    all.copyFrom(in);
  } else {
    pg.allgather(bufferView(in), bufferView(all))->wait();
  }
  shape[0] = datasetSize;
  ag::Tensor out = ag::empty(shape, local.dtype());
  std::memcpy(out.rawData(), all.rawData(), out.nbytes());
  return out;
}

}  // namespace loom::ddp
