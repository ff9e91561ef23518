// The c10d collectives of ProcessGroupLoom, each mapped onto one Loom operation (see
// process_group_loom.h for what is staged and what is rejected).
//
// Every method follows the same steps: check the tensors (CPU, dtype, one per process), wrap
// inputs and outputs in Staged (a view of their own storage when they are contiguous, else a
// staging buffer), copy staged inputs in, issue the Loom operation, and return a WorkLoom whose
// finish step copies staged outputs back. The Staged values ride in the finish step, so every
// tensor Loom reads or writes lives until the operation is over.
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "loom/common/error.h"
#include "process_group_loom.h"
#include "tensor_views.h"
#include "work_loom.h"

namespace loom::torch_backend {

namespace {

using StagedPtr = std::shared_ptr<Staged>;

StagedPtr stageIn(std::vector<at::Tensor> tensors, const char* opName) {
  auto staged = std::make_shared<Staged>(std::move(tensors), opName);
  staged->copyIn();
  return staged;
}

// Refused before the operation is issued: a result cannot be written into a tensor whose
// elements share memory (an expanded view); torch would refuse the copy back only after the
// collective ran.
void checkWritable(const std::vector<at::Tensor>& tensors, const char* opName) {
  for (const at::Tensor& t : tensors) {
    // Other layouts and devices are refused by Staged's own checks, with their reason.
    if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu()) continue;
    if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
      LOOM_THROW(InvalidArgumentError, opName,
                 ": the output tensor has elements that share memory (an expanded view, stride "
                 "0); pass one that owns its elements (.clone() or .contiguous())");
    }
  }
}

StagedPtr stageOut(std::vector<at::Tensor> tensors, const char* opName) {
  checkWritable(tensors, opName);
  return std::make_shared<Staged>(std::move(tensors), opName);
}

// A buffer that is input and output (in place).
StagedPtr stageInPlace(const at::Tensor& t, const char* opName) {
  checkWritable({t}, opName);
  return stageIn({t}, opName);
}

// Point-to-point: any dtype, as bytes when Loom has not the type (tensor_views.h).
StagedPtr stageInBytes(const at::Tensor& t, const char* opName) {
  auto staged = std::make_shared<Staged>(std::vector<at::Tensor>{t}, opName, /*bytes=*/true);
  staged->copyIn();
  return staged;
}

StagedPtr stageOutBytes(const at::Tensor& t, const char* opName) {
  checkWritable({t}, opName);
  return std::make_shared<Staged>(std::vector<at::Tensor>{t}, opName, /*bytes=*/true);
}

// Copies `out` back when the operation succeeded; keeps `in` alive until then.
std::function<void()> finishing(StagedPtr in, StagedPtr out) {
  return [in = std::move(in), out = std::move(out)] {
    if (out) out->copyOut();
  };
}

void checkRootTensor(int64_t rootTensor, const char* opName) {
  if (rootTensor != 0) {
    LOOM_THROW(InvalidArgumentError, opName,
               ": the loom backend takes one tensor per process; rootTensor must be 0, got ",
               rootTensor);
  }
}

// The element count of every tensor of `list`.
std::vector<size_t> countsOf(const std::vector<at::Tensor>& list) {
  std::vector<size_t> counts;
  for (const at::Tensor& t : list) counts.push_back(static_cast<size_t>(t.numel()));
  return counts;
}

// The one list of a c10d list-of-lists argument, of `size` tensors.
std::vector<at::Tensor>& listOf(std::vector<std::vector<at::Tensor>>& lists, int size,
                                const char* opName, const char* what) {
  if (lists.size() != 1) {
    LOOM_THROW(InvalidArgumentError, opName, ": the loom backend takes one ", what,
               " list per process, got ", lists.size());
  }
  if (static_cast<int>(lists.front().size()) != size) {
    LOOM_THROW(InvalidArgumentError, opName, ": the ", what, " list has ", lists.front().size(),
               " tensors; expected the world size, ", size);
  }
  return lists.front();
}

// The one list of a c10d list-of-lists argument, of `size` tensors with `numel` elements each.
std::vector<at::Tensor>& evenList(std::vector<std::vector<at::Tensor>>& lists, int size,
                                  int64_t numel, const char* opName, const char* what) {
  if (lists.size() != 1) {
    LOOM_THROW(InvalidArgumentError, opName, ": the loom backend takes one ", what,
               " list per process, got ", lists.size());
  }
  auto& list = lists.front();
  if (static_cast<int>(list.size()) != size) {
    LOOM_THROW(InvalidArgumentError, opName, ": the ", what, " list has ", list.size(),
               " tensors; expected the world size, ", size);
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].numel() != numel) {
      LOOM_THROW(NotAvailableError, opName, ": ", what, " tensor ", i, " has ", list[i].numel(),
                 " elements, expected ", numel,
                 ": uneven sizes are not supported by the loom backend yet");
    }
  }
  return list;
}

BufferView emptyView(const at::Tensor& like, const char* opName) {
  return BufferView{nullptr, 0, toLoomDtype(like.scalar_type(), opName), Device::cpu()};
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  CoalescingBlockGuard block(*this, "broadcast");
  const char* name = "broadcast";
  checkRootTensor(opts.rootTensor, name);
  at::Tensor& t = single(tensors, name);
  auto buf = stageInPlace(t, name);
  auto work = pg_->broadcast(
      buf->view(), {.root = static_cast<int>(opts.rootRank), .timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::BROADCAST, std::move(work), {t}, finishing(nullptr, buf));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  CoalescingBlockGuard block(*this, "allreduce");
  const char* name = "allreduce";
  at::Tensor& t = single(tensors, name);
  auto buf = stageInPlace(t, name);
  const LoomReduce reduce = toLoomReduce(opts.reduceOp, t.scalar_type(), name);
  if (reduce.premul) buf->scale(*reduce.premul);
  auto work =
      pg_->allreduce(buf->view(), {.reduceOp = reduce.op, .timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::ALLREDUCE, std::move(work), {t}, finishing(nullptr, buf));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  CoalescingBlockGuard block(*this, "allreduce_coalesced");
  // One Loom operation for every tensor (one sequence number, one pass on the wire).
  const char* name = "allreduce_coalesced";
  LOOM_CHECK(!tensors.empty(), name, ": empty tensor list");
  const LoomReduce reduce = toLoomReduce(opts.reduceOp, tensors.front().scalar_type(), name);
  std::vector<StagedPtr> bufs;
  std::vector<BufferView> views;
  for (const at::Tensor& t : tensors) {
    bufs.push_back(stageInPlace(t, name));
    if (reduce.premul) bufs.back()->scale(*reduce.premul);
    views.push_back(bufs.back()->view());
  }
  auto work =
      pg_->allreduceCoalesced(views, {.reduceOp = reduce.op, .timeout = timeoutOf(opts.timeout)});
  auto finish = [bufs] {
    for (const auto& buf : bufs) buf->copyOut();
  };
  return workOf(c10d::OpType::ALLREDUCE_COALESCED, std::move(work), tensors, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  CoalescingBlockGuard block(*this, "reduce");
  const char* name = "reduce";
  checkRootTensor(opts.rootTensor, name);
  at::Tensor& t = single(tensors, name);
  auto buf = stageInPlace(t, name);
  const LoomReduce reduce = toLoomReduce(opts.reduceOp, t.scalar_type(), name);
  const int root = static_cast<int>(opts.rootRank);
  if (reduce.premul) buf->scale(*reduce.premul);
  auto work = pg_->reduce(
      buf->view(), {.reduceOp = reduce.op, .root = root, .timeout = timeoutOf(opts.timeout)});
  // With PREMUL_SUM the other ranks' tensors keep their values (the scaled copy stays ours,
  // alive until the operation is over).
  const bool copyBack = !reduce.premul || rank_ == root;
  return workOf(c10d::OpType::REDUCE, std::move(work), {t},
                finishing(buf, copyBack ? buf : nullptr));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  CoalescingBlockGuard block(*this, "allgather");
  const char* name = "allgather";
  at::Tensor& input = single(inputs, name);
  auto& outList = listOf(outputs, size_, name, "output");
  auto in = stageIn({input}, name);
  auto out = stageOut(outList, name);
  const std::vector<size_t> counts = countsOf(outList);
  bool even = true;
  for (size_t c : counts) even = even && c == static_cast<size_t>(input.numel());
  auto work =
      even ? pg_->allgather(in->view(), out->view(), {.timeout = timeoutOf(opts.timeout)})
           : pg_->allgatherv(in->view(), out->view(), counts, {.timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::ALLGATHER, std::move(work), outList, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  CoalescingBlockGuard block(*this, "_allgather_base");
  const char* name = "_allgather_base";
  auto in = stageIn({input}, name);
  auto out = stageOut({output}, name);
  auto work = pg_->allgather(in->view(), out->view(), {.timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::_ALLGATHER_BASE, std::move(work), {output}, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& /*outputs*/, std::vector<at::Tensor>& /*inputs*/,
    const c10d::AllgatherOptions& /*opts*/) {
  CoalescingBlockGuard block(*this, "allgather_coalesced");
  LOOM_THROW(NotAvailableError, "allgather_coalesced is not supported by the loom backend (torch ",
             kTorchVersion,
             "; use all_gather per tensor, or all_gather_into_tensor on one flat tensor)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  CoalescingBlockGuard block(*this, "gather");
  const char* name = "gather";
  at::Tensor& input = single(inputs, name);
  const int root = static_cast<int>(opts.rootRank);
  auto in = stageIn({input}, name);
  StagedPtr out;
  BufferView outView = emptyView(input, name);
  std::vector<at::Tensor> results;
  if (rank_ == root) {
    results = evenList(outputs, size_, input.numel(), name, "output");
    out = stageOut(results, name);
    outView = out->view();
  } else if (!outputs.empty() && !outputs.front().empty()) {
    LOOM_THROW(InvalidArgumentError, name, ": output tensors are only given on the root (rank ",
               root, "); this is rank ", rank_);
  }
  auto work = pg_->gather(in->view(), outView, {.root = root, .timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::GATHER, std::move(work), results, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  CoalescingBlockGuard block(*this, "scatter");
  const char* name = "scatter";
  at::Tensor& output = single(outputs, name);
  const int root = static_cast<int>(opts.rootRank);
  StagedPtr in;
  BufferView inView = emptyView(output, name);
  if (rank_ == root) {
    in = stageIn(evenList(inputs, size_, output.numel(), name, "input"), name);
    inView = in->view();
  } else if (!inputs.empty() && !inputs.front().empty()) {
    LOOM_THROW(InvalidArgumentError, name, ": input tensors are only given on the root (rank ",
               root, "); this is rank ", rank_);
  }
  auto out = stageOut({output}, name);
  auto work = pg_->scatter(inView, out->view(), {.root = root, .timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::SCATTER, std::move(work), {output}, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  CoalescingBlockGuard block(*this, "reduce_scatter");
  const char* name = "reduce_scatter";
  at::Tensor& output = single(outputs, name);
  // Input tensor j goes to rank j: its size is rank j's output size, the same on every rank.
  auto& inList = listOf(inputs, size_, name, "input");
  auto in = stageIn(inList, name);
  auto out = stageOut({output}, name);
  const LoomReduce reduce = toLoomReduce(opts.reduceOp, output.scalar_type(), name);
  if (reduce.premul) in->scale(*reduce.premul);
  const ReduceScatterOptions loomOpts{.reduceOp = reduce.op, .timeout = timeoutOf(opts.timeout)};
  const std::vector<size_t> counts = countsOf(inList);
  bool even = true;
  for (size_t c : counts) even = even && c == static_cast<size_t>(output.numel());
  auto work = even ? pg_->reduceScatter(in->view(), out->view(), loomOpts)
                   : pg_->reduceScatterv(in->view(), out->view(), counts, loomOpts);
  return workOf(c10d::OpType::REDUCE_SCATTER, std::move(work), {output}, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  CoalescingBlockGuard block(*this, "_reduce_scatter_base");
  const char* name = "_reduce_scatter_base";
  auto in = stageIn({input}, name);
  auto out = stageOut({output}, name);
  const LoomReduce reduce = toLoomReduce(opts.reduceOp, input.scalar_type(), name);
  if (reduce.premul) in->scale(*reduce.premul);
  auto work = pg_->reduceScatter(in->view(), out->view(),
                                 {.reduceOp = reduce.op, .timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::_REDUCE_SCATTER_BASE, std::move(work), {output}, finishing(in, out));
}

namespace {

// c10d's split sizes (rows of dim 0) as Loom's (elements); empty stays empty (equal blocks),
// which must then be whole rows, as c10d's checkSplitSizes asks: equal element blocks of a
// (3, 2) tensor over 2 ranks would cut its middle row in two.
std::vector<size_t> elementSplits(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                  const char* opName, const char* what) {
  if (splits.empty()) {
    if (t.dim() >= 1 && t.size(0) % size != 0) {
      LOOM_THROW(InvalidArgumentError, opName, ": the ", what, " tensor's dim 0 (", t.size(0),
                 " rows) does not divide equally across the group's ", size,
                 " ranks; pass split sizes for uneven blocks");
    }
    return {};
  }
  if (static_cast<int>(splits.size()) != size) {
    LOOM_THROW(InvalidArgumentError, opName, ": ", what, " split sizes have ", splits.size(),
               " entries; expected the world size, ", size);
  }
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t rowElements = rows == 0 ? 0 : t.numel() / rows;
  std::vector<size_t> elements;
  for (int64_t s : splits) {
    LOOM_CHECK(s >= 0, opName, ": negative ", what, " split size ", s);
    elements.push_back(static_cast<size_t>(s * rowElements));
  }
  return elements;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  CoalescingBlockGuard block(*this, "alltoall_base");
  const char* name = "alltoall_base";
  checkTensor(input, name);
  checkTensor(output, name);
  const auto inSplits = elementSplits(input, inputSplitSizes, size_, name, "input");
  const auto outSplits = elementSplits(output, outputSplitSizes, size_, name, "output");
  auto in = stageIn({input}, name);
  auto out = stageOut({output}, name);
  auto work = pg_->alltoallv(in->view(), inSplits, out->view(), outSplits,
                             {.timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::ALLTOALL_BASE, std::move(work), {output}, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  CoalescingBlockGuard block(*this, "alltoall");
  const char* name = "alltoall";
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
    LOOM_THROW(InvalidArgumentError, name, ": expected ", size_, " input and output tensors, got ",
               inputs.size(), " and ", outputs.size());
  }
  auto in = stageIn(inputs, name);
  auto out = stageOut(outputs, name);
  auto work = pg_->alltoallv(in->view(), countsOf(inputs), out->view(), countsOf(outputs),
                             {.timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::ALLTOALL, std::move(work), outputs, finishing(in, out));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                      int tag) {
  CoalescingBlockGuard block(*this, "send");
  const char* name = "send";
  at::Tensor& t = single(tensors, name);
  auto in = stageInBytes(t, name);
  auto work = pg_->send(in->view(), dstRank, static_cast<uint64_t>(static_cast<uint32_t>(tag)));
  return workOf(c10d::OpType::SEND, std::move(work), {t}, finishing(in, nullptr));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                      int tag) {
  CoalescingBlockGuard block(*this, "recv");
  const char* name = "recv";
  at::Tensor& t = single(tensors, name);
  auto out = stageOutBytes(t, name);
  auto work = pg_->recv(out->view(), srcRank, static_cast<uint64_t>(static_cast<uint32_t>(tag)));
  return workOf(c10d::OpType::RECV, std::move(work), {t}, finishing(nullptr, out), srcRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int tag) {
  CoalescingBlockGuard block(*this, "recvAnysource");
  const char* name = "recv_anysource";
  at::Tensor& t = single(tensors, name);
  auto out = stageOutBytes(t, name);
  auto work = pg_->recvAnySource(out->view(), static_cast<uint64_t>(static_cast<uint32_t>(tag)));
  // sourceRank -1: WorkLoom asks the Loom Work, which knows the sender once it completed.
  return workOf(c10d::OpType::RECVANYSOURCE, std::move(work), {t}, finishing(nullptr, out));
}

void ProcessGroupLoom::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  pg_->monitoredBarrier({.timeout = timeoutOf(opts.timeout), .waitAllRanks = waitAllRanks})->wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::barrier(const c10d::BarrierOptions& opts) {
  CoalescingBlockGuard block(*this, "barrier");
  auto work = pg_->barrier({.timeout = timeoutOf(opts.timeout)});
  return workOf(c10d::OpType::BARRIER, std::move(work), {}, finishing(nullptr, nullptr));
}

#if LOOM_TORCH_AT_LEAST(2, 1)

namespace {

// The pairs of a *_tensor_coalesced call: as many outputs as inputs, of one dtype per pair,
// output and input elements in the ratio outPerIn:inPerOut (all-gather size:1,
// reduce-scatter 1:size).
void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                int64_t outPerIn, int64_t inPerOut, const char* opName) {
  if (inputs.empty() || inputs.size() != outputs.size()) {
    LOOM_THROW(InvalidArgumentError, opName,
               ": expected as many outputs as inputs (at least 1), got ", outputs.size(), " and ",
               inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], opName);
    checkTensor(outputs[i], opName);
    if (outputs[i].scalar_type() != inputs[i].scalar_type()) {
      LOOM_THROW(InvalidArgumentError, opName, ": pair ", i, " has output dtype ",
                 c10::toString(outputs[i].scalar_type()), " and input dtype ",
                 c10::toString(inputs[i].scalar_type()));
    }
    if (outputs[i].numel() * inPerOut != inputs[i].numel() * outPerIn) {
      LOOM_THROW(InvalidArgumentError, opName, ": pair ", i, " has ", outputs[i].numel(),
                 " output and ", inputs[i].numel(), " input elements; expected a ratio of ",
                 outPerIn, ":", inPerOut);
    }
  }
}

// The pairs' indices grouped by dtype, in order of first appearance: one Loom operation each.
std::vector<std::vector<size_t>> byDtype(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<size_t>> groups;
  std::vector<at::ScalarType> types;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto it = std::find(types.begin(), types.end(), tensors[i].scalar_type());
    if (it == types.end()) {
      types.push_back(tensors[i].scalar_type());
      groups.push_back({i});
    } else {
      groups[static_cast<size_t>(it - types.begin())].push_back(i);
    }
  }
  return groups;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  CoalescingBlockGuard block(*this, "allgather_into_tensor_coalesced");
  // Input i of every rank goes to output i, rank after rank. The inputs travel packed in one
  // buffer (rank r's block of the gathered buffer holds its inputs end to end), and the
  // gathered blocks are unpacked into the outputs: one Loom all-gather per dtype.
  const char* name = "allgather_into_tensor_coalesced";
  checkPairs(outputs, inputs, size_, 1, name);
  std::vector<std::shared_ptr<loom::Work>> works;
  std::vector<std::function<void()>> unpacks;
  for (const auto& group : byDtype(inputs)) {
    int64_t total = 0;
    for (size_t i : group) total += inputs[i].numel();
    at::Tensor packed = at::empty({total}, inputs[group.front()].options());
    at::Tensor gathered = at::empty({size_, total}, inputs[group.front()].options());
    int64_t offset = 0;
    for (size_t i : group) {
      packed.narrow(0, offset, inputs[i].numel()).copy_(inputs[i].reshape({-1}));
      offset += inputs[i].numel();
    }
    works.push_back(pg_->allgather(bufferView(packed, name), bufferView(gathered, name),
                                   {.timeout = timeoutOf(opts.timeout)}));
    unpacks.push_back([packed, gathered, group, outputs, inputs]() mutable {
      int64_t at = 0;
      for (size_t i : group) {
        const int64_t n = inputs[i].numel();
        outputs[i].copy_(gathered.narrow(1, at, n).reshape(outputs[i].sizes()));
        at += n;
      }
    });
  }
  auto finish = [unpacks = std::move(unpacks)] {
    for (const auto& unpack : unpacks) unpack();
  };
  return track(c10::make_intrusive<WorkLoom>(rank_, c10d::OpType::COALESCED, std::move(works),
                                             outputs, std::move(finish), -1, completer_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  CoalescingBlockGuard block(*this, "reduce_scatter_tensor_coalesced");
  // Block r of input i (size blocks of output i's size) goes to rank r. Packed so that block
  // r of the packed buffer holds block r of every input end to end; one Loom reduce-scatter
  // per dtype leaves this rank's block, whose pieces are the outputs.
  const char* name = "reduce_scatter_tensor_coalesced";
  checkPairs(outputs, inputs, 1, size_, name);
  std::vector<std::shared_ptr<loom::Work>> works;
  std::vector<std::function<void()>> unpacks;
  for (const auto& group : byDtype(inputs)) {
    const at::ScalarType dtype = inputs[group.front()].scalar_type();
    const LoomReduce reduce = toLoomReduce(opts.reduceOp, dtype, name);
    int64_t total = 0;
    for (size_t i : group) total += outputs[i].numel();
    at::Tensor packed = at::empty({size_, total}, inputs[group.front()].options());
    at::Tensor reduced = at::empty({total}, inputs[group.front()].options());
    int64_t offset = 0;
    for (size_t i : group) {
      const int64_t n = outputs[i].numel();
      packed.narrow(1, offset, n).copy_(inputs[i].reshape({size_, n}));
      offset += n;
    }
    if (reduce.premul) packed.mul_(*reduce.premul);
    works.push_back(
        pg_->reduceScatter(bufferView(packed, name), bufferView(reduced, name),
                           {.reduceOp = reduce.op, .timeout = timeoutOf(opts.timeout)}));
    unpacks.push_back([packed, reduced, group, outputs]() mutable {
      int64_t at = 0;
      for (size_t i : group) {
        const int64_t n = outputs[i].numel();
        outputs[i].copy_(reduced.narrow(0, at, n).view(outputs[i].sizes()));
        at += n;
      }
    });
  }
  auto finish = [unpacks = std::move(unpacks)] {
    for (const auto& unpack : unpacks) unpack();
  };
  return track(c10::make_intrusive<WorkLoom>(rank_, c10d::OpType::COALESCED, std::move(works),
                                             outputs, std::move(finish), -1, completer_));
}

#endif  // LOOM_TORCH_AT_LEAST(2, 1)

}  // namespace loom::torch_backend
