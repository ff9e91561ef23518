#include "loom/ddp/comm_hook.h"

#include <cstdint>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/common/error.h"

namespace loom::ddp {

void WorkFuture::wait() {
  if (done_) return;
  work_->wait();
  if (then_) then_();
  done_ = true;
}

namespace {

// The group averages (ReduceOp::kAvg: the sum, divided once by the world size inside the
// algorithm, vectorised, before the result is shared), so every rank ends with the same bits.
class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::unique_ptr<HookFuture> start(ProcessGroup& pg, GradBucket& bucket) override {
    AllreduceOptions opts;
    opts.reduceOp = ReduceOp::kAvg;
    return std::make_unique<WorkFuture>(pg.allreduce(view(bucket.data, bucket.count), opts));
  }
};

// Compression: each rank divides by the world size first (so the half-precision sum cannot
// overflow where the float sum would not), rounds to 16 bits, and the group sums the 16-bit
// values (widened to float for each addition, rounded once); the result widens back.
class CompressHook : public CommHook {
 public:
  explicit CompressHook(bool bf16) : bf16_(bf16) {}
  std::string name() const override { return bf16_ ? "bf16" : "fp16"; }
  std::unique_ptr<HookFuture> start(ProcessGroup& pg, GradBucket& bucket) override {
    auto packed = std::make_shared<std::vector<uint16_t>>(bucket.count);
    const float scale = 1.0f / static_cast<float>(pg.size());
    for (size_t i = 0; i < bucket.count; ++i) {
      const float v = bucket.data[i] * scale;
      (*packed)[i] = bf16_ ? comm::floatToBFloat16(v) : comm::floatToHalf(v);
    }
    BufferView buf{packed->data(), packed->size(), bf16_ ? DType::kBFloat16 : DType::kFloat16,
                   Device::cpu()};
    auto work = pg.allreduce(buf);
    float* data = bucket.data;
    const bool bf16 = bf16_;
    return std::make_unique<WorkFuture>(std::move(work), [packed, data, bf16] {
      for (size_t i = 0; i < packed->size(); ++i) {
        data[i] = bf16 ? comm::bfloat16ToFloat((*packed)[i]) : comm::halfToFloat((*packed)[i]);
      }
    });
  }

 private:
  bool bf16_;
};

}  // namespace

std::shared_ptr<CommHook> allreduceHook() {
  return std::make_shared<AllreduceHook>();
}
std::shared_ptr<CommHook> fp16CompressHook() {
  return std::make_shared<CompressHook>(false);
}
std::shared_ptr<CommHook> bf16CompressHook() {
  return std::make_shared<CompressHook>(true);
}

std::shared_ptr<CommHook> commHookByName(const std::string& name) {
  if (name == "none" || name == "allreduce") return allreduceHook();
  if (name == "fp16") return fp16CompressHook();
  if (name == "bf16") return bf16CompressHook();
  LOOM_THROW(InvalidArgumentError, "unknown communication hook '", name,
             "': expected none, fp16 or bf16");
}

}  // namespace loom::ddp
