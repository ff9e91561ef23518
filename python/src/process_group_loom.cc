#include "process_group_loom.h"

#include <Python.h>

#include <algorithm>
#include <utility>

#include "loom/common/error.h"
#include "loom/common/interfaces.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/process_group/factory.h"
#include "store_adapter.h"

namespace loom::torch_backend {

namespace {

ProcessGroupOptions loomOptions(const BackendOptions& options) {
  ProcessGroupOptions pg;
  pg.timeout = options.timeout;
  pg.comm.context.reproducible = options.reproducible;
  // As initProcessGroup does: peers on other hosts reach us on LOOM_SOCKET_IFNAME's interface,
  // else on the address on the route to the store's host (the host name may resolve to
  // 127.0.1.1 on Debian).
  if (!settings::text("LOOM_HOST"))
    pg.comm.context.host = net::defaultListenAddress(options.storeHost);
  // Torch runs a TCPStore's server in the process that created it (rank 0 under env://, the
  // agent under torchrun): that process's leaving waits for the others'.
  pg.hostsStore = options.storePort > 0 && net::thisProcessListensOn(options.storePort);
  pg.groupName = options.groupName;
  pg.parentRanks = options.parentRanks;
  return pg;
}

}  // namespace

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   const BackendOptions& options)
    : C10dBase(rank, size), options_(options) {
  LOOM_CHECK(options.timeout.count() > 0, "loom backend: timeout must be positive, got ",
             options.timeout.count(), " ms");
  store_ = std::make_shared<TorchStore>(store);
  store_->setTimeout(options.timeout);
  pg_ = createProcessGroup("tcp", store_, rank, size, loomOptions(options));
}

ProcessGroupLoom::~ProcessGroupLoom() {
  // The completer (destroyed first) would wait for dropped Works' operations to the end of
  // their timeout; nobody can wait for them any more.
  endOrphans("the group was destroyed");
  leaveWithoutGil();
}

void ProcessGroupLoom::leaveWithoutGil() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  // A thread that gives the GIL back while the interpreter finalizes may never get it again.
  if (Py_IsInitialized() && !finalizing && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    pg_->leave();
    PyEval_RestoreThread(state);
  } else {
    pg_->leave();
  }
}

void ProcessGroupLoom::abort() {
  pg_->abort("aborted through torch (ProcessGroup.abort / _abort_process_group)");
}

void ProcessGroupLoom::shutdown() {
  endOrphans("the group was shut down (destroy_process_group)");
  leaveWithoutGil();
}

void ProcessGroupLoom::endOrphans(const char* why) {
  const int orphans = completer_->orphans();
  if (orphans == 0 || pg_->isBroken()) return;
  pg_->abort(detail::str(why, " while ", orphans,
                         " operation(s) whose Work was dropped before it completed still ran"));
}

bool ProcessGroupLoom::reproducible() const {
  return pg_->reproducible();
}

uint64_t ProcessGroupLoom::storeRequests() const {
  return store_->requests();
}

namespace {

// PREMUL_SUM's factor: the supplement holds a double or a one-element tensor (1.13: a list of
// tensors, one per device; torch 2.x: one tensor). The name NCCLPreMulSumSupplement exists in
// both (2.x keeps it as an alias of PreMulSumSupplement).
template <typename Supplement>
double factorOf(const Supplement& s) {
  if constexpr (requires { s.tensor_factor; }) {
    if (s.tensor_factor.defined()) return s.tensor_factor.template item<double>();
  } else {
    if (!s.tensor_factors.empty()) return s.tensor_factors.front().template item<double>();
  }
  return s.double_factor;
}

}  // namespace

LoomReduce toLoomReduce(const c10d::ReduceOp& op, at::ScalarType dtype, const char* opName) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return {ReduceOp::kSum};
    case c10d::ReduceOp::AVG:
      return {ReduceOp::kAvg};
    case c10d::ReduceOp::PRODUCT:
      return {ReduceOp::kProd};
    case c10d::ReduceOp::MIN:
      return {ReduceOp::kMin};
    case c10d::ReduceOp::MAX:
      return {ReduceOp::kMax};
    case c10d::ReduceOp::BAND:
      return {ReduceOp::kBand};
    case c10d::ReduceOp::BOR:
      return {ReduceOp::kBor};
    case c10d::ReduceOp::BXOR:
      return {ReduceOp::kBxor};
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!at::isFloatingType(dtype)) {
        LOOM_THROW(InvalidArgumentError, opName, ": PREMUL_SUM needs a floating-point dtype, got ",
                   c10::toString(dtype));
      }
      const auto* supplement =
          dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      LOOM_CHECK(supplement != nullptr, opName, ": PREMUL_SUM without its factor");
      return {ReduceOp::kSum, factorOf(*supplement)};
    }
    default:
      LOOM_THROW(InvalidArgumentError, opName, ": the loom backend does not support reduce op ",
                 static_cast<int>(op.op_), " (torch ", kTorchVersion, ")");
  }
}

OptionalTimeout toLoomTimeout(std::chrono::milliseconds timeout) {
  if (timeout == c10d::kUnsetTimeout || timeout.count() <= 0) return std::nullopt;
  return timeout;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::workOf(c10d::OpType type,
                                                        std::shared_ptr<loom::Work> work,
                                                        std::vector<at::Tensor> outputs,
                                                        std::function<void()> finish,
                                                        int sourceRank) {
  std::vector<std::shared_ptr<loom::Work>> works{std::move(work)};
  return track(c10::make_intrusive<WorkLoom>(rank_, type, std::move(works), std::move(outputs),
                                             std::move(finish), sourceRank, completer_));
}

OptionalTimeout ProcessGroupLoom::timeoutOf(std::chrono::milliseconds timeout) const {
  const int64_t set = timeoutMs_.load(std::memory_order_relaxed);
  if ((timeout == c10d::kUnsetTimeout || timeout.count() <= 0) && set > 0) {
    return std::chrono::milliseconds(set);
  }
  return toLoomTimeout(timeout);
}

void ProcessGroupLoom::setTimeout(std::chrono::milliseconds timeout) {
  LOOM_CHECK(timeout.count() > 0, "set_timeout: the loom backend's timeout must be positive, got ",
             timeout.count(), " ms");
  timeoutMs_.store(timeout.count(), std::memory_order_relaxed);
}

uint64_t ProcessGroupLoom::getSequenceNumberForGroup() {
  return pg_->lastSeq();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::track(c10::intrusive_ptr<WorkLoom> work) {
  if (coalescing_) coalesced_.push_back(work);
  // Abandoned Works are let go once they completed.
  std::erase_if(abandoned_, [](const auto& w) { return w->isCompleted(); });
  return work;
}

void ProcessGroupLoom::abandonCoalescing(const char* opName) {
  coalescing_ = false;
  abandonedBy_ = opName;
  for (auto& w : coalesced_) abandoned_.push_back(std::move(w));
  coalesced_.clear();
}

#if LOOM_TORCH_AT_LEAST(2, 1)
void ProcessGroupLoom::startCoalescing() {
  abandonedBy_.clear();
  if (coalescing_) {
    // torch pairs every start with an end unless the block's body raised: a Python error
    // between the operations left the last block open. Its operations run on, abandoned.
    TORCH_WARN(
        "loom: a coalescing block was left without endCoalescing (an exception in its "
        "body); its ",
        coalesced_.size(), " operation(s) run on without a batch Work");
    abandonCoalescing("the block's body");
    abandonedBy_.clear();
  }
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::endCoalescing() {
  if (!coalescing_ && !abandonedBy_.empty()) {
    const std::string by = abandonedBy_;
    abandonedBy_.clear();
    LOOM_THROW(InvalidArgumentError, "endCoalescing: the coalescing block already ended when ", by,
               " raised in it; the operations issued before it run on");
  }
  if (!coalescing_) {
    LOOM_THROW(InvalidArgumentError, "endCoalescing: without startCoalescing");
  }
  coalescing_ = false;
  auto parts = std::move(coalesced_);
  coalesced_.clear();
  // One Work over every operation issued in between: it waits for their Loom Works, then
  // runs each part's finish step (its wait); its future holds every part's outputs.
  std::vector<std::shared_ptr<loom::Work>> works;
  std::vector<at::Tensor> outputs;
  for (const auto& part : parts) {
    works.insert(works.end(), part->loomWorks().begin(), part->loomWorks().end());
    const auto partOutputs = part->result();
    outputs.insert(outputs.end(), partOutputs.begin(), partOutputs.end());
  }
  auto finish = [parts = std::move(parts)] {
    for (const auto& part : parts) part->wait();
  };
  return c10::make_intrusive<WorkLoom>(rank_, c10d::OpType::COALESCED, std::move(works),
                                       std::move(outputs), std::move(finish), -1, completer_);
}
#endif

#if LOOM_TORCH_HAS_BACKEND_SPLIT
c10::intrusive_ptr<c10d::Backend> ProcessGroupLoom::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  // Called on every rank of the parent; the members build the child group together.
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  BackendOptions options = options_;
  if (opts && opts->timeout.count() > 0) options.timeout = opts->timeout;
  return c10::make_intrusive<ProcessGroupLoom>(store, static_cast<int>(it - ranks.begin()),
                                               static_cast<int>(ranks.size()), options);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupLoom::getBackendOptions() {
  return c10::make_intrusive<Options>("loom", options_.timeout);
}
#endif

}  // namespace loom::torch_backend
