// ProcessGroupLoom: torch's c10d interface ("loom" in torch.distributed) adapted onto
// loom::ProcessGroup. It reimplements no collective: each c10d call checks its tensors, turns
// them into buffer views and issues the matching Loom operation.
//
// Contract
// - One source for every supported torch (torch_compat.h): on 1.13 it is a c10d::ProcessGroup,
//   from 2.1 on a c10d::Backend (the "cpu" backend of torch's ProcessGroup). What a version
//   lacks is not compiled for it; what torch asks and Loom cannot do raises NotAvailableError
//   naming the call and the torch version.
// - Created collectively by torch (init_process_group, new_group) on every rank of the group
//   with the group's store; Loom's "tcp" backend runs underneath (shared memory between ranks
//   on one host, TCP between hosts). The timeout torch passes is the group's deadline: setup
//   and every operation whose options leave it unset.
// - CPU tensors only, one tensor per process and argument (CUDA, sparse and other layouts are
//   rejected with an InvalidArgumentError naming the operation). A contiguous tensor goes to
//   Loom as a view of its storage, no copy. A non-contiguous tensor, or a list form whose
//   tensors do not lie end to end in one storage (allgather, gather, scatter, reduce_scatter,
//   alltoall lists), goes through one contiguous staging buffer, copied in before and out
//   after the operation.
// - Uneven lists (allgather, reduce_scatter, alltoall) and alltoall_base split sizes go to
//   Loom's uneven collectives; allreduce_coalesced is one Loom operation; monitoredBarrier and
//   recvAnysource are Loom's. Rejected with an error that says so: an uneven gather (the other
//   ranks cannot know the root's counts), allgather_coalesced.
// - Reduce ops: SUM, PRODUCT, MIN, MAX, AVG and the bitwise ones are Loom's. PREMUL_SUM (the
//   factor from its supplement: a double or a one-element tensor) scales a staging copy of the
//   input, never the caller's input, then sums; floating-point dtypes only.
// - torch 2.x: allgather_into_tensor_coalesced and reduce_scatter_tensor_coalesced pack their
//   tensors into one staging buffer and run as one Loom operation (one per dtype when the
//   dtypes differ). startCoalescing / endCoalescing (_coalescing_manager with a device,
//   batch_isend_irecv): the calls in between are issued at once, in order (Loom runs
//   back-to-back point-to-point operations as one batch); endCoalescing returns one Work over
//   all of them, whose future holds all their outputs; from 2.7 supportsCoalescing says so, and
//   batch_isend_irecv uses the block. From 2.9: supportsSplitting / split (split_group) make
//   the child group a new Loom group over the members, on the store torch gives, with the
//   parent's options and the timeout torch passes.
// - Issue collectives from one thread at a time (torch does): the issue order is Loom's
//   sequence order, the same on every rank.
// - Failures: Loom's exceptions (loom::Error and kinds) reach Python with Loom's message
//   (rank, op#seq, peer); after an IoError the group is unusable, as in Loom.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/process_group/process_group.h"
#include "torch_compat.h"
#include "work_loom.h"

namespace loom::torch_backend {

class TorchStore;

struct BackendOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // The host of the store torch rendezvoused on (TCPStore's host), empty for a FileStore:
  // Loom listens on the address on the route to it unless LOOM_HOST names one.
  std::string storeHost{};
  // The TCPStore's port (0: not a TCPStore). The process that listens on it hosts the store's
  // server, and its leaving waits for the other ranks' (ProcessGroup::leave).
  int storePort = 0;
  // The group as torch names it, and the default group's ranks it holds (empty for the default
  // group): loom::ProcessGroupOptions::groupName and parentRanks.
  std::string groupName{};
  std::vector<int> parentRanks{};
  // Reproducible reductions (docs/reproducible.md): SUM and AVG over floating tensors give the
  // correctly rounded result, bitwise the same whatever the algorithm, transport or rank order.
  // false leaves LOOM_REPRODUCIBLE in charge.
  bool reproducible = false;
};

class ProcessGroupLoom : public C10dBase {
 public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   const BackendOptions& options = {});
  ~ProcessGroupLoom() override;

  const std::string getBackendName() const override { return "loom"; }
  // Loom's collective sequence number (op#seq), the same on every rank after the same
  // collectives: what TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper compares across ranks. Loom's
  // numbers start at 0 on every rank, so there is nothing to set.
  uint64_t getSequenceNumberForGroup() override;
  void setSequenceNumberForGroup() override {}
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
  // dist.set_timeout: the deadline of the operations issued from now on whose options leave
  // theirs unset (must be positive). It overrides c10d::Backend::setTimeout on the torches
  // that have it; without `override` so that the same source builds on those that do not.
  void setTimeout(std::chrono::milliseconds timeout);
  // torch's abort (dist.distributed_c10d._abort_process_group, ProcessGroup.abort): every
  // blocked, queued and later operation fails at once (loom::ProcessGroup::abort). torch 2.x;
  // without `override` for the torches whose Backend has no abort().
  void abort();
  // torch's shutdown (destroy_process_group on torch 2.x): a normal end. Operations still
  // running that nobody can wait for any more (their Works were dropped) are aborted, since
  // nothing would end them but their timeout; an idle group is left to its destructor, so that
  // peers still finishing the last collective are not failed. Then the group leaves
  // (loom::ProcessGroup::leave): in the process that hosts torch's TCPStore, that waits (at
  // most 10 s, without the GIL) for the other ranks to stop using the store before torch
  // closes it.
  void shutdown();
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
  loom::ProcessGroup& loomGroup() {
    return *pg_;
  }
  // Requests the group has sent to torch's store (store_adapter.h), for tests.
  uint64_t storeRequests() const;

 private:
  // pg_->leave() without the GIL: its wait must not stop the process's other Python threads
  // (torch 1.13 has no shutdown(); its destructor runs as Python drops the group, holding it).
  void leaveWithoutGil();

 public:
  // Whether the group's reductions run in reproducible mode, as its Loom group decided it
  // (loom::ProcessGroup::reproducible: the option, else LOOM_REPRODUCIBLE).
  bool reproducible() const;
  // The group's own store, as Loom sees it (keys under the group's prefixes; for tests).
  TorchStore& store() {
    return *store_;
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

#if LOOM_TORCH_AT_LEAST(2, 1)
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#endif
#if LOOM_TORCH_HAS_SUPPORTS_COALESCING
  bool supportsCoalescing() const override {
    return true;
  }
#endif
#if LOOM_TORCH_HAS_BACKEND_SPLIT
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
#endif

 private:
  // The Work of one issued operation; between startCoalescing and endCoalescing also kept for
  // the Work endCoalescing returns.
  c10::intrusive_ptr<c10d::Work> workOf(c10d::OpType type, std::shared_ptr<loom::Work> work,
                                        std::vector<at::Tensor> outputs,
                                        std::function<void()> finish, int sourceRank = -1);
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<WorkLoom> work);
  // c10d's timeout as Loom's: kUnsetTimeout is the one setTimeout set, else the group's.
  OptionalTimeout timeoutOf(std::chrono::milliseconds timeout) const;

  // Ends a coalescing block that an exception left open (CoalescingBlockGuard): torch's
  // _coalescing_manager has no try/finally, so endCoalescing never comes. The operations issued
  // in it run on; their Works are kept until they complete, not in a batch nobody waits for.
  void abandonCoalescing(const char* opName);
  // Aborts the group when dropped Works' operations still run (shutdown, the destructor).
  void endOrphans(const char* why);
  friend class CoalescingBlockGuard;

  const BackendOptions options_;
  std::shared_ptr<TorchStore> store_;
  std::shared_ptr<loom::ProcessGroup> pg_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<WorkLoom>> coalesced_;
  // A block an operation's exception ended (abandonCoalescing): what failed, for the
  // endCoalescing that may still come, and the Works still running.
  std::string abandonedBy_;
  std::vector<c10::intrusive_ptr<WorkLoom>> abandoned_;
  std::atomic<int64_t> timeoutMs_{0};  // setTimeout's, 0: the group's
  // Completes the futures of this group's Works (work_loom.h). Declared after pg_ so that it
  // goes first: its last tasks wait on operations of a group that still exists.
  std::shared_ptr<FutureCompleter> completer_ = std::make_shared<FutureCompleter>();
};

// c10d's reduce op as Loom's: PREMUL_SUM is kSum with `premul` set to its factor (the caller
// scales the input); a factor for a dtype that is not floating point is an InvalidArgumentError.
struct LoomReduce {
  ReduceOp op = ReduceOp::kSum;
  std::optional<double> premul{};
};
LoomReduce toLoomReduce(const c10d::ReduceOp& op, at::ScalarType dtype, const char* opName);
// c10d's timeout (kUnsetTimeout: the group's) as Loom's.
OptionalTimeout toLoomTimeout(std::chrono::milliseconds timeout);

// Put first in every operation that can be issued inside a coalescing block: when the
// operation throws while a block is open, the block is abandoned (ProcessGroupLoom::
// abandonCoalescing) instead of collecting every later operation's Work for good.
class CoalescingBlockGuard {
 public:
  CoalescingBlockGuard(ProcessGroupLoom& pg, const char* opName)
      : pg_(pg), opName_(opName), exceptions_(std::uncaught_exceptions()) {}
  ~CoalescingBlockGuard() {
    if (std::uncaught_exceptions() > exceptions_ && pg_.coalescing_) pg_.abandonCoalescing(opName_);
  }
  CoalescingBlockGuard(const CoalescingBlockGuard&) = delete;
  CoalescingBlockGuard& operator=(const CoalescingBlockGuard&) = delete;

 private:
  ProcessGroupLoom& pg_;
  const char* opName_;
  int exceptions_;
};

}  // namespace loom::torch_backend
