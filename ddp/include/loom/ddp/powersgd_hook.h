// PowerSGD: a comm hook that all-reduces low-rank approximations of the gradient matrices
// (Vogels et al. 2019), with PyTorch's semantics (torch.distributed.algorithms.ddp_comm_hooks.
// powerSGD_hook in torch 1.13).
//
// How it works, per bucket (M: one parameter's gradient viewed as n x m, n = its first dim)
// - Before iteration startPowerSgdIter the bucket is averaged with a plain all-reduce. The
//   iteration count advances when the last bucket of an iteration is reduced.
// - Error feedback: the error this rank's approximation made last time is added to the bucket
//   first; afterwards error = (bucket with error added) - (its approximation).
// - A gradient is compressed when (n + m) * r * minCompressionRate < n * m, with
//   r = min(n, m, matrixApproximationRank); 1-d gradients and the rest are summed uncompressed
//   (one all-reduce of their concatenation, divided by the world size).
// - For a compressed M, with Q (m x r): P = M Q, all-reduce(P), orthogonalize P (Gram-Schmidt
//   on its columns), Q = M^T P, all-reduce(Q) / world size, and M is replaced by P Q^T.
//   P and Q of a bucket live in two flat buffers, laid out by shape groups as PyTorch does
//   (tensors of the first shape seen first, in bucket order), each row-major.
// - Warm start: Q is kept from one iteration to the next (orthogonalized again before use);
//   without it, or the first time, Q is drawn from a normal distribution with a seed drawn
//   from a generator seeded randomSeed, the same on every rank. (The draw is Loom's own, not
//   torch.randn's; state() lets a caller install a Q, e.g. from a checkpoint.) PyTorch
//   orthogonalizes with QR for r > 2 instead of Gram-Schmidt: the columns span the same space
//   and P Q^T is the same up to rounding.
// - Asynchrony: start() adds the error, multiplies P = M Q and issues the all-reduces of the
//   uncompressed part and of P; the future's wait() finishes (orthogonalize, Q, all-reduce of
//   Q, decompress). Every rank issues the same collectives in the same order.
// Thread-safety: as any comm hook, driven by one DDP's training thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loom/ddp/comm_hook.h"

namespace loom::ddp {

struct PowerSgdOptions {
  int matrixApproximationRank = 1;
  int64_t startPowerSgdIter = 1000;  // > 1 when useErrorFeedback or warmStart (as PyTorch)
  double minCompressionRate = 2.0;
  bool useErrorFeedback = true;
  bool warmStart = true;
  double orthogonalizationEpsilon = 0.0;
  uint64_t randomSeed = 0;
};

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(const PowerSgdOptions& options = {});
  std::string name() const override { return "powersgd"; }
  std::unique_ptr<HookFuture> start(ProcessGroup& pg, GradBucket& bucket) override;

  struct BucketState {
    std::vector<float> error;  // error feedback, bucket.count floats (empty until first use)
    std::vector<float> p, q;   // low-rank factors (empty until first compressed iteration);
                               // a q of the right length is used as the warm start
  };
  // Per bucket index; what a checkpoint of the hook holds, with iteration().
  std::map<int, BucketState>& state() { return state_; }
  int64_t iteration() const { return iteration_; }
  void setIteration(int64_t iteration) { iteration_ = iteration; }
  const PowerSgdOptions& options() const { return options_; }
  // Floats sent per rank so far by compressed iterations, and what plain all-reduces of the same
  // buckets would have sent.
  int64_t floatsSent() const { return floatsSent_; }
  int64_t floatsUncompressed() const { return floatsUncompressed_; }

 private:
  void maybeIncreaseIteration(const GradBucket& bucket);

  PowerSgdOptions options_;
  std::map<int, BucketState> state_;
  int64_t iteration_ = 0;
  std::mt19937 seeds_;
  int64_t floatsSent_ = 0, floatsUncompressed_ = 0;
};

}  // namespace loom::ddp
