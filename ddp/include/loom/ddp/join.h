// Join: training with uneven inputs (PyTorch's torch.distributed.algorithms.Join for DDP).
//
//   {
//     ddp::Join join(ddp);                 // every rank, before its first batch
//     for (auto& batch : myBatches) { ... ddp.forward(x) ... backward ... opt.step(); }
//     join.finish();                       // this rank is out of data
//   }
//
// How it works
// - While the Join lives, every training forward begins with one all-reduce of a flag per rank
//   (0: out of data, 1: training under noSync, 2: training with gradient sync), so every rank
//   knows which ranks still have data in this iteration.
// - finish() makes this rank shadow the others: each round it takes part in that all-reduce
//   with 0; when some rank still trains it mirrors that iteration's collectives (the buffer
//   broadcast when broadcastBuffers is on, then the reducer's bucket reductions with zero
//   gradients, see Reducer::shadowBackward), so the ranks with data never wait on it. When
//   every rank is out, the highest rank among those that trained in the last iteration
//   broadcasts its parameters and buffers, so every rank ends with the same model.
// - Gradients: ranks out of data contribute zeros. With divideByInitialWorldSize (the default,
//   as PyTorch) the sum is divided by the world size; without it, by the number of ranks that
//   had data in that iteration (their average).
// - Buffers are broadcast from the highest rank with data in the iteration (rank 0 may be out).
// Collective: every rank of the group creates the Join and calls finish(). The destructor
// leaves join mode (it never communicates); a Join destroyed without finish() on one rank leaves
// the others waiting until their group's timeout.
#pragma once

#include "loom/ddp/distributed_data_parallel.h"

namespace loom::ddp {

class Join {
 public:
  explicit Join(DistributedDataParallel& ddp, const JoinOptions& options = {}) : ddp_(ddp) {
    ddp_.joinBegin(options);
  }
  ~Join() { ddp_.joinEnd(); }
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank is out of data; returns when every rank is, with the final model in place.
  void finish() { ddp_.joinShadowUntilAllJoined(); }

 private:
  DistributedDataParallel& ddp_;
};

}  // namespace loom::ddp
