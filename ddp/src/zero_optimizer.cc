#include "loom/ddp/zero_optimizer.h"

#include <algorithm>
#include <cstring>

#include "float_memory.h"
#include "loom/common/error.h"
#include "loom/ddp/distributed_data_parallel.h"

namespace loom::ddp {

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(ag::nn::NamedTensors parameters,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 OptimizerFactory factory, ZeroOptions options)
    : params_(std::move(parameters)), pg_(std::move(pg)) {
  LOOM_CHECK(pg_ != nullptr, "ZeroRedundancyOptimizer needs a process group");
  LOOM_CHECK(factory != nullptr, "ZeroRedundancyOptimizer needs an optimizer factory");
  for (const auto& [name, p] : params_) {
    LOOM_CHECK(p.dtype() == ag::DType::kFloat32, pg_->who(),
               ": ZeroRedundancyOptimizer: parameter '", name, "' is ", ag::dtypeName(p.dtype()),
               "; only float32 parameters are sharded");
    numel_ += p.numel();
  }
  const int world = pg_->size();
  shard_ = (numel_ + world - 1) / world;
  // Every rank must flatten the same number of floats.
  if (world > 1) {
    std::vector<int64_t> counts(world);
    pg_->allgather(view(&numel_, 1), view(counts.data(), counts.size()))->wait();
    for (int r = 0; r < world; ++r) {
      LOOM_CHECK_EQ(counts[r], numel_, pg_->who(), ": ZeroRedundancyOptimizer: rank ", r, " has ",
                    counts[r], " parameter floats, this rank ", numel_,
                    "; every rank must pass the same parameters");
    }
    broadcastTensors(*pg_, params_, 0);
  }
  flatCount_ = static_cast<size_t>(shard_ * world);
  flat_ = allocateFloats(flatCount_, options.windowBuffer, "ZeRO-1: the flat vector");
  slice_ = ag::zeros({shard_});
  slice_.setRequiresGrad(true);
  packSlice();
  local_ = factory({slice_});
  LOOM_CHECK(local_ != nullptr, "ZeroRedundancyOptimizer: the factory returned no optimizer");
}

// Copies this rank's slice of the parameters into slice_ (the parameters are authoritative:
// a caller may have loaded a checkpoint into them).
void ZeroRedundancyOptimizer::packSlice() {
  const int64_t begin = pg_->rank() * shard_, end = begin + shard_;
  float* dst = slice_.data<float>();
  std::fill(dst, dst + shard_, 0.0f);
  int64_t at = 0;
  for (const auto& [name, p] : params_) {
    const int64_t lo = std::max(at, begin), hi = std::min(at + p.numel(), end);
    if (lo < hi) std::memcpy(dst + (lo - begin), p.data<float>() + (lo - at), (hi - lo) * 4);
    at += p.numel();
  }
}

void ZeroRedundancyOptimizer::zeroGrad() {
  for (auto& [name, p] : params_) {
    ag::Tensor g = p.grad();
    if (g.defined()) std::fill(g.data<float>(), g.data<float>() + g.numel(), 0.0f);
  }
}

void ZeroRedundancyOptimizer::step() {
  float* flat = this->flat();
  int64_t at = 0;
  for (const auto& [name, p] : params_) {
    const ag::Tensor g = p.grad();
    if (g.defined()) {
      std::memcpy(flat + at, g.data<float>(), static_cast<size_t>(p.numel()) * 4);
    } else {
      std::fill(flat + at, flat + at + p.numel(), 0.0f);
    }
    at += p.numel();
  }
  std::fill(flat + at, flat + flatCount_, 0.0f);
  ag::Tensor grad = slice_.mutableGrad();
  if (pg_->size() > 1) {
    ReduceScatterOptions opts;
    opts.reduceOp = ReduceOp::kAvg;
    pg_->reduceScatter(view(flat, flatCount_),
                       view(grad.data<float>(), static_cast<size_t>(shard_)), opts)
        ->wait();
  } else {
    std::memcpy(grad.data<float>(), flat, static_cast<size_t>(shard_) * 4);
  }
  packSlice();
  local_->step();
  // In place: this rank's slice goes to its place in the flat vector, which is then the
  // all-gather's input as well as its output (a window on every rank: read in place by peers).
  float* mine = flat + static_cast<size_t>(pg_->rank() * shard_);
  std::memcpy(mine, slice_.data<float>(), static_cast<size_t>(shard_) * 4);
  if (pg_->size() > 1) {
    pg_->allgather(view(mine, static_cast<size_t>(shard_)), view(flat, flatCount_))->wait();
  }
  at = 0;
  for (auto& [name, p] : params_) {
    std::memcpy(p.data<float>(), flat + at, static_cast<size_t>(p.numel()) * 4);
    at += p.numel();
  }
}

size_t ZeroRedundancyOptimizer::stateBytes() const {
  size_t bytes = 0;
  for (const auto& [name, t] : local_->stateDict()) {
    bytes += static_cast<size_t>(t.numel()) * ag::dtypeSize(t.dtype());
  }
  return bytes;
}

bool ZeroRedundancyOptimizer::isSharded(const ag::Tensor& t) const {
  return t.dtype() == ag::DType::kFloat32 && t.shape() == ag::Shape{shard_};
}

ag::nn::NamedTensors ZeroRedundancyOptimizer::consolidatedStateDict() {
  ag::nn::NamedTensors local = local_->stateDict();
  // Ranks agree on the entries (the same optimizer, stepped together): check the count.
  if (pg_->size() > 1) {
    std::vector<int64_t> counts(pg_->size());
    int64_t mine = static_cast<int64_t>(local.size());
    pg_->allgather(view(&mine, 1), view(counts.data(), counts.size()))->wait();
    for (int r = 0; r < pg_->size(); ++r) {
      LOOM_CHECK_EQ(counts[r], mine, pg_->who(), ": ZeroRedundancyOptimizer: rank ", r, " has ",
                    counts[r], " optimizer state entries, this rank ", mine);
    }
  }
  ag::nn::NamedTensors out;
  std::vector<float> all(static_cast<size_t>(shard_ * pg_->size()));
  for (auto& [name, t] : local) {
    if (!isSharded(t)) {
      ag::nn::NamedTensors one{{name, t}};
      broadcastTensors(*pg_, one, 0);
      out.emplace_back(name, t);
      continue;
    }
    if (pg_->size() > 1) {
      pg_->allgather(view(t.data<float>(), static_cast<size_t>(shard_)),
                     view(all.data(), all.size()))
          ->wait();
    } else {
      std::memcpy(all.data(), t.data<float>(), static_cast<size_t>(shard_) * 4);
    }
    ag::Tensor full = ag::zeros({numel_});
    std::memcpy(full.data<float>(), all.data(), static_cast<size_t>(numel_) * 4);
    out.emplace_back(name, full);
  }
  return out;
}

void ZeroRedundancyOptimizer::loadConsolidatedStateDict(const ag::nn::NamedTensors& state) {
  ag::nn::NamedTensors local;
  const int64_t begin = pg_->rank() * shard_;
  for (const auto& [name, t] : state) {
    if (t.dtype() == ag::DType::kFloat32 && t.shape() == ag::Shape{numel_} &&
        name.rfind("state.", 0) == 0) {
      ag::Tensor mine = ag::zeros({shard_});
      const int64_t count = std::max<int64_t>(0, std::min(shard_, numel_ - begin));
      if (count > 0) {
        std::memcpy(mine.data<float>(), t.data<float>() + begin, static_cast<size_t>(count) * 4);
      }
      local.emplace_back(name, mine);
    } else {
      local.emplace_back(name, t);
    }
  }
  try {
    local_->loadStateDict(local);
  } catch (const std::invalid_argument& e) {
    LOOM_THROW(InvalidArgumentError, pg_->who(),
               ": ZeroRedundancyOptimizer: the consolidated state does not fit (sharded entries "
               "must be float32 [",
               numel_, "]): ", e.what());
  }
}

}  // namespace loom::ddp
