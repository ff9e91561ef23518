#include "loom/ddp/sync_batch_norm.h"

#include <cmath>
#include <vector>

#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/common/error.h"

namespace loom::ddp {

SyncBatchNorm::SyncBatchNorm(int64_t numFeatures, std::shared_ptr<ProcessGroup> pg,
                             const ag::nn::BatchNorm1dOptions& options)
    : numFeatures_(numFeatures), pg_(std::move(pg)), options_(options) {
  LOOM_CHECK(numFeatures > 0, "SyncBatchNorm: numFeatures must be positive, got ", numFeatures);
  LOOM_CHECK(pg_ != nullptr, "SyncBatchNorm needs a process group");
  if (options_.affine) {
    weight_ = registerParameter("weight", ag::ones({numFeatures}));
    bias_ = registerParameter("bias", ag::zeros({numFeatures}));
  }
  if (options_.trackRunningStats) {
    runningMean_ = registerBuffer("running_mean", ag::zeros({numFeatures}));
    runningVar_ = registerBuffer("running_var", ag::ones({numFeatures}));
    numBatchesTracked_ = registerBuffer("num_batches_tracked", ag::zeros({}, ag::DType::kInt64));
  }
}

std::string SyncBatchNorm::describe() const {
  return "SyncBatchNorm(" + std::to_string(numFeatures_) + ", eps=" + std::to_string(options_.eps) +
         ", momentum=" + std::to_string(options_.momentum) + ")";
}

ag::Tensor SyncBatchNorm::forward(const ag::Tensor& x) {
  LOOM_CHECK(x.defined() && x.dim() == 2 && x.size(1) == numFeatures_, pg_->who(),
             ": SyncBatchNorm expects input [N, ", numFeatures_, "], got ",
             x.defined() ? ag::shapeToString(x.shape()) : "undefined");
  LOOM_CHECK(x.dtype() == ag::DType::kFloat32, "SyncBatchNorm: input must be float32, got ",
             ag::dtypeName(x.dtype()));
  if (!isTraining() && options_.trackRunningStats) {
    return ag::batchNorm(x, runningMean_, runningVar_, weight_, bias_, false, options_.momentum,
                         options_.eps);
  }
  const int64_t n = x.size(0), c = numFeatures_;
  const float* xd = x.data<float>();
  // stats: sum[c], sum of squares[c], row count.
  std::vector<double> stats(2 * c + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const double v = xd[i * c + j];
      stats[j] += v;
      stats[c + j] += v * v;
    }
  }
  stats[2 * c] = static_cast<double>(n);
  if (pg_->size() > 1) pg_->allreduce(view(stats.data(), stats.size()))->wait();
  const double m = stats[2 * c];
  LOOM_CHECK(m > 1, pg_->who(),
             ": SyncBatchNorm needs more than one value per channel in "
             "training, got a global batch of ",
             m);
  std::vector<double> mean(c), var(c);
  auto invstd = std::make_shared<std::vector<float>>(c);
  for (int64_t j = 0; j < c; ++j) {
    mean[j] = stats[j] / m;
    var[j] = std::max(0.0, stats[c + j] / m - mean[j] * mean[j]);
    (*invstd)[j] = static_cast<float>(1.0 / std::sqrt(var[j] + options_.eps));
  }
  ag::Tensor xhat = ag::empty({n, c});
  ag::Tensor out = ag::empty({n, c});
  float* hd = xhat.data<float>();
  float* od = out.data<float>();
  const float* w = weight_.defined() ? weight_.data<float>() : nullptr;
  const float* b = bias_.defined() ? bias_.data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const float h = static_cast<float>((xd[i * c + j] - mean[j]) * (*invstd)[j]);
      hd[i * c + j] = h;
      od[i * c + j] = (w ? w[j] : 1.0f) * h + (b ? b[j] : 0.0f);
    }
  }
  if (options_.trackRunningStats) {
    float* rm = runningMean_.data<float>();
    float* rv = runningVar_.data<float>();
    const double mom = options_.momentum;
    for (int64_t j = 0; j < c; ++j) {
      rm[j] = static_cast<float>((1 - mom) * rm[j] + mom * mean[j]);
      rv[j] = static_cast<float>((1 - mom) * rv[j] + mom * var[j] * m / (m - 1));
    }
    ++*numBatchesTracked_.data<int64_t>();
  }
  std::shared_ptr<ProcessGroup> pg = pg_;
  ag::Tensor weight = weight_.defined() ? weight_.detach() : ag::Tensor();
  ag::recordOp(out, "SyncBatchNorm", {&x, &weight_, &bias_},
               [pg, xhat, invstd, weight, n, c, m](const ag::Tensor& dy) {
                 const float* g = dy.data<float>();
                 const float* h = xhat.data<float>();
                 // sums: dy[c], dy * xhat[c] (local, then global).
                 std::vector<double> local(2 * c, 0.0);
                 for (int64_t i = 0; i < n; ++i) {
                   for (int64_t j = 0; j < c; ++j) {
                     local[j] += g[i * c + j];
                     local[c + j] += static_cast<double>(g[i * c + j]) * h[i * c + j];
                   }
                 }
                 std::vector<double> global = local;
                 if (pg->size() > 1) pg->allreduce(view(global.data(), global.size()))->wait();
                 ag::Tensor dx = ag::empty({n, c});
                 float* dxd = dx.data<float>();
                 const float* w = weight.defined() ? weight.data<float>() : nullptr;
                 for (int64_t i = 0; i < n; ++i) {
                   for (int64_t j = 0; j < c; ++j) {
                     const double scale = (w ? w[j] : 1.0) * (*invstd)[j];
                     dxd[i * c + j] = static_cast<float>(
                         scale * (g[i * c + j] - global[j] / m - h[i * c + j] * global[c + j] / m));
                   }
                 }
                 ag::Tensor dw = ag::empty({c}), db = ag::empty({c});
                 for (int64_t j = 0; j < c; ++j) {
                   dw.data<float>()[j] = static_cast<float>(local[c + j]);
                   db.data<float>()[j] = static_cast<float>(local[j]);
                 }
                 return std::vector<ag::Tensor>{dx, dw, db};
               });
  return out;
}

std::shared_ptr<ag::nn::Module> convertSyncBatchNorm(std::shared_ptr<ag::nn::Module> module,
                                                     std::shared_ptr<ProcessGroup> pg) {
  LOOM_CHECK(module != nullptr, "convertSyncBatchNorm: module is null");
  if (auto bn = std::dynamic_pointer_cast<ag::nn::BatchNorm1d>(module)) {
    auto sync = std::make_shared<SyncBatchNorm>(bn->numFeatures(), pg, bn->options());
    sync->loadStateDict(bn->stateDict());
    sync->train(bn->isTraining());
    return sync;
  }
  const auto children = module->namedChildren();
  for (const auto& [name, child] : children) {
    auto converted = convertSyncBatchNorm(child, pg);
    if (converted != child) module->replaceChild(name, converted);
  }
  return module;
}

}  // namespace loom::ddp
