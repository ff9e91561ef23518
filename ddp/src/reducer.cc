#include "loom/ddp/reducer.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "float_memory.h"
#include "loom/autograd/engine.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/process_group/trace.h"

namespace loom::ddp {

Reducer::Reducer(NamedParameters parameters, std::shared_ptr<ProcessGroup> pg,
                 const ReducerOptions& options)
    : params_(std::move(parameters)), pg_(std::move(pg)), options_(options) {
  LOOM_CHECK(pg_ != nullptr, "Reducer needs a process group");
  LOOM_CHECK(options_.bucketCapMb >= 0 && options_.firstBucketCapMb >= 0,
             "bucket caps must be >= 0 MiB, got bucketCapMb=", options_.bucketCapMb,
             " firstBucketCapMb=", options_.firstBucketCapMb);
  if (!options_.commHook) options_.commHook = allreduceHook();
  for (const auto& [name, p] : params_) {
    LOOM_CHECK(p.dtype() == ag::DType::kFloat32, who(), ": parameter '", name, "' is ",
               ag::dtypeName(p.dtype()), "; DDP reduces float32 parameters only");
  }
  std::vector<size_t> order;
  for (size_t i = params_.size(); i-- > 0;) order.push_back(i);
  buildBuckets(order);
  for (size_t i = 0; i < params_.size(); ++i) {
    hookHandles_.push_back(
        params_[i].second.registerGradReadyHook([this, i](ag::Tensor&) { onGradReady(i); }));
  }
}

Reducer::~Reducer() {
  waitLaunched();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].second.removeGradReadyHook(hookHandles_[i]);
  }
}

std::string Reducer::who() const {
  return pg_->who() + ": DDP";
}

std::vector<std::string> Reducer::bucketParameterNames(size_t i) const {
  LOOM_CHECK_LT(i, buckets_.size(), "bucket index out of range");
  return buckets_[i].view.parameterNames;
}

void Reducer::setCommHook(std::shared_ptr<CommHook> hook) {
  LOOM_CHECK(!expecting_, who(), ": cannot change the comm hook during a backward pass");
  options_.commHook = hook ? std::move(hook) : allreduceHook();
}

// Closes a bucket once it holds at least its cap (PyTorch's rule), so a parameter larger than
// the cap gets a bucket of its own and a cap of 0 gives one bucket per parameter.
void Reducer::buildBuckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucketOf_.assign(params_.size(), 0);
  slotOf_.assign(params_.size(), 0);
  const double mib = 1024.0 * 1024.0;
  double cap = options_.firstBucketCapMb * mib;
  size_t bytes = 0;
  for (size_t p : order) {
    if (buckets_.empty() || bytes >= cap) {
      if (!buckets_.empty()) cap = options_.bucketCapMb * mib;
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    bucketOf_[p] = buckets_.size() - 1;
    slotOf_[p] = b.params.size();
    b.params.push_back(p);
    bytes += static_cast<size_t>(params_[p].second.numel()) * sizeof(float);
  }
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    size_t count = 0;
    for (size_t p : b.params) {
      b.offsets.push_back(count);
      b.view.parameterNames.push_back(params_[p].first);
      b.view.shapes.push_back(params_[p].second.shape());
      count += static_cast<size_t>(params_[p].second.numel());
    }
    b.storage = allocateFloats(count, options_.windowBuckets, "DDP: buckets");
    b.count = count;
    b.view.index = static_cast<int>(i);
    b.view.isLast = i + 1 == buckets_.size();
    b.view.data = b.data();
    b.view.count = count;
    b.view.offsets = b.offsets;
  }
}

void Reducer::rebuildFromObservedOrder() {
  const size_t n = params_.size();
  std::vector<int64_t> order;
  std::vector<char> seen(n, 0);
  for (size_t p : readyOrder_) {
    if (!seen[p]) order.push_back(static_cast<int64_t>(p)), seen[p] = 1;
  }
  for (size_t p = n; p-- > 0;) {
    if (!seen[p]) order.push_back(static_cast<int64_t>(p));
  }
  // Every rank must use the same layout: take rank 0's observed order.
  if (pg_->size() > 1 && n > 0) pg_->broadcast(view(order.data(), order.size()))->wait();
  std::vector<size_t> layout;
  std::fill(seen.begin(), seen.end(), 0);
  for (int64_t p : order) {
    LOOM_CHECK(p >= 0 && static_cast<size_t>(p) < n && !seen[p], who(),
               ": rank 0 sent an invalid bucket order (parameter index ", p, " of ", n, ")");
    seen[p] = 1;
    layout.push_back(static_cast<size_t>(p));
  }
  buildBuckets(layout);
  rebuilt_ = true;
  rebuildPending_ = false;
}

ag::Tensor Reducer::bucketView(size_t param) {
  const ag::Tensor& p = params_[param].second;
  auto impl = std::make_shared<ag::TensorImpl>();
  impl->storage =
      std::make_shared<ag::Storage>(slot(param), static_cast<size_t>(p.numel()) * sizeof(float),
                                    buckets_[bucketOf_[param]].storage);
  impl->shape = p.shape();
  impl->numel = p.numel();
  impl->dtype = ag::DType::kFloat32;
  return ag::Tensor(std::move(impl));
}

// Parameters with a defined gradient that is not their bucket slot (a new one from autograd
// after zeroGrad(setToNone), or one in a bucket from before a rebuild) move it into the slot
// and take the view. Undefined gradients stay undefined.
void Reducer::attachGradViews() {
  for (size_t p = 0; p < params_.size(); ++p) {
    ag::Tensor& param = params_[p].second;
    const ag::Tensor grad = param.grad();
    if (!grad.defined()) continue;
    float* dst = slot(p);
    if (grad.data<float>() == dst) continue;
    std::memcpy(dst, grad.data<float>(), static_cast<size_t>(param.numel()) * sizeof(float));
    param.setGrad(bucketView(p));
  }
}

void Reducer::resetIteration() {
  expecting_ = false;
  firstHookSeen_ = false;
  finalizeQueued_ = false;
  nextLaunch_ = 0;
  readyCount_ = 0;
  ready_.assign(params_.size(), 0);
  locallyUsed_.assign(params_.size(), 0);
  hadGrad_.assign(params_.size(), 0);
  unused_.clear();
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.future.reset();
    b.launched = false;
    b.traceStartUs = 0;
  }
}

void Reducer::prepareForBackward(const std::vector<ag::Tensor>& outputs) {
  if (expecting_) finalize();  // throws the unused-parameter error when it never finished
  if (rebuildPending_) rebuildFromObservedOrder();
  resetIteration();
  if (options_.gradientAsBucketView) attachGradViews();
  expecting_ = true;
  if (staticKnown_) {
    unused_ = staticUnused_;
  } else if (agreesOnUsed()) {
    searchUnused(outputs);
  }
}

void Reducer::searchUnused(const std::vector<ag::Tensor>& outputs) {
  ++graphSearches_;
  // Leaves reachable from the outputs; parameters outside that set are this iteration's unused.
  std::unordered_set<const ag::TensorImpl*> reached;
  std::unordered_set<const ag::Node*> visited;
  std::vector<const ag::Node*> stack;
  for (const ag::Tensor& out : outputs) {
    if (!out.defined()) continue;
    if (out.gradFn()) {
      stack.push_back(out.gradFn().get());
    } else {
      reached.insert(out.impl().get());
    }
  }
  while (!stack.empty()) {
    const ag::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    for (const auto& input : node->inputs()) {
      if (!input) continue;
      if (input->gradFn) {
        stack.push_back(input->gradFn.get());
      } else {
        reached.insert(input.get());
      }
    }
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!reached.count(params_[p].second.impl().get())) unused_.push_back(p);
  }
}

void Reducer::onGradReady(size_t param) {
  if (!expecting_) return;
  try {
    if (!firstHookSeen_) {
      firstHookSeen_ = true;
      for (size_t u : unused_) markReady(u, false);
      // Finalize once the whole pass is done (PyTorch's queue_callback), so that waiting for
      // the last buckets never holds up backward nodes that still have work to do.
      if (ag::inBackward()) {
        ag::queueCallback([this] { finalize(); });
        finalizeQueued_ = true;
      }
    }
    markReady(param, true);
    launchReadyBuckets();
    if (trace::enabled()) traceCompletedBuckets();
  } catch (...) {
    // The iteration is abandoned (the error leaves backward); the next forward starts afresh
    // instead of reporting parameters that never got their gradient.
    waitLaunched();
    resetIteration();
    throw;
  }
  if (!finalizeQueued_ && readyCount_ == params_.size()) finalize();
}

void Reducer::markReady(size_t param, bool fromHook) {
  if (ready_[param] && fromHook && staticKnown_ && staticUnusedFlag_[param]) {
    LOOM_THROW(InvalidArgumentError, who(), ": staticGraph: parameter '", params_[param].first,
               "' was unused in the first iteration but got a gradient in iteration ",
               iterations_ + 1,
               "; with staticGraph the set of parameters that take part in the loss must not "
               "change after the first iteration (construct DistributedDataParallel without "
               "staticGraph, and with findUnusedParameters, for a graph that changes)");
  }
  if (ready_[param]) {
    LOOM_THROW(InvalidArgumentError, who(), ": parameter '", params_[param].first,
               "' got a gradient twice in one iteration",
               fromHook ? " (did backward run twice after one forward, or is it marked "
                          "unused but used?)"
                        : "");
  }
  ready_[param] = 1;
  ++readyCount_;
  if (fromHook) locallyUsed_[param] = 1;
  if (!rebuilt_) readyOrder_.push_back(param);
  Bucket& b = buckets_[bucketOf_[param]];
  float* dst = b.data() + b.offsets[slotOf_[param]];
  const ag::Tensor grad = params_[param].second.grad();
  const size_t count = static_cast<size_t>(params_[param].second.numel());
  hadGrad_[param] = grad.defined();
  if (grad.defined()) {
    if (grad.data<float>() != dst) std::memcpy(dst, grad.data<float>(), count * sizeof(float));
  } else {
    std::memset(dst, 0, count * sizeof(float));
  }
  --b.pending;
}

void Reducer::launchReadyBuckets() {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    startBucket(buckets_[nextLaunch_]);
    ++nextLaunch_;
  }
}

void Reducer::startBucket(Bucket& b) {
  b.traceStartUs = trace::enabled() ? trace::nowUs() : 0;
  b.traceReady = readyCount_;
  b.view.data = b.data();
  b.future = options_.commHook->start(*pg_, b.view);
  b.launched = true;
}

void Reducer::traceBucketEnd(Bucket& b) {
  if (b.traceStartUs == 0) return;
  const size_t i = static_cast<size_t>(b.view.index);
  while (traceLanes_.size() <= i) {
    traceLanes_.push_back(trace::lane("ddp bucket " + std::to_string(traceLanes_.size())));
  }
  trace::completeOn(traceLanes_[i], "bucket " + std::to_string(i) + " " + options_.commHook->name(),
                    "ddp", b.traceStartUs, trace::nowUs(),
                    detail::str("\"bucket\": ", i, ", \"bytes\": ", b.view.count * sizeof(float),
                                ", \"iteration\": ", iterations_, ", \"ready\": ", b.traceReady,
                                ", \"params\": ", params_.size()));
  b.traceStartUs = 0;
}

void Reducer::traceCompletedBuckets() {
  for (Bucket& b : buckets_) {
    if (b.traceStartUs != 0 && b.future && b.future->isCompleted()) traceBucketEnd(b);
  }
}

void Reducer::waitLaunched() noexcept {
  for (Bucket& b : buckets_) {
    if (!b.future) continue;
    try {
      b.future->wait();
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING(who(), ": bucket ", b.view.index,
                       " failed while abandoning the iteration: ", e.what());
    }
    b.traceStartUs = 0;
    b.future.reset();
  }
}

void Reducer::finalize() {
  if (!expecting_) return;
  if (readyCount_ < params_.size()) {
    waitLaunched();
    std::string names;
    size_t missing = 0;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (ready_[p]) continue;
      if (missing++ < 20) names += (names.empty() ? "" : ", ") + params_[p].first;
    }
    if (missing > 20) names += ", ...";
    resetIteration();
    if (staticKnown_) {
      LOOM_THROW(InvalidArgumentError, who(), ": staticGraph: ", missing, " of ", params_.size(),
                 " parameters took part in the first iteration but got no gradient in iteration ",
                 iterations_ + 1, ": ", names,
                 "; with staticGraph the set of parameters that take part in the loss must not "
                 "change after the first iteration (construct DistributedDataParallel without "
                 "staticGraph, and with findUnusedParameters, for a graph that changes)");
    }
    LOOM_THROW(InvalidArgumentError, who(), ": ", missing, " of ", params_.size(),
               " parameters got no gradient in the last synced backward: ", names,
               ". Every parameter that requires grad must take part in the loss; construct "
               "DistributedDataParallel with findUnusedParameters = true if some are unused in "
               "some iterations",
               missing == params_.size() ? " (none got one: was backward run after forward?)" : "");
  }
  // The autograd pass has computed every gradient: what follows is DDP's tail.
  const int64_t traceStartUs = trace::enabled() ? trace::nowUs() : 0;
  if (traceStartUs != 0) traceCompletedBuckets();
  try {
    for (Bucket& b : buckets_) {
      if (!b.future) continue;
      b.future->wait();
      if (traceStartUs != 0) {
        traceBucketEnd(b);
        traceCompletedBuckets();
      }
    }
  } catch (...) {
    waitLaunched();
    resetIteration();
    throw;
  }
  std::vector<int32_t> globalUsed;
  if (staticKnown_) {
    globalUsed = staticGlobalUsed_;
  } else if (agreesOnUsed()) {
    globalUsed.assign(locallyUsed_.begin(), locallyUsed_.end());
    if (pg_->size() > 1 && !globalUsed.empty()) {
      pg_->allreduce(view(globalUsed.data(), globalUsed.size()))->wait();
    }
    if (options_.staticGraph) {
      staticUnused_ = unused_;
      staticUnusedFlag_.assign(params_.size(), 0);
      for (size_t u : unused_) staticUnusedFlag_[u] = 1;
      staticGlobalUsed_ = globalUsed;
      staticKnown_ = true;
    }
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    ag::Tensor& param = params_[p].second;
    if (!globalUsed.empty() && globalUsed[p] == 0 && !param.grad().defined()) continue;
    float* src = slot(p);
    const size_t count = static_cast<size_t>(param.numel());
    if (options_.gradientAsBucketView) {
      const ag::Tensor current = param.grad();
      if (!current.defined() || current.data<float>() != src) param.setGrad(bucketView(p));
      if (gradScale_ != 1.0f) {
        for (size_t i = 0; i < count; ++i) src[i] *= gradScale_;
      }
      continue;
    }
    ag::Tensor grad = param.mutableGrad();
    float* dst = grad.data<float>();
    if (gradScale_ == 1.0f) {
      std::memcpy(dst, src, count * sizeof(float));
    } else {
      for (size_t i = 0; i < count; ++i) dst[i] = src[i] * gradScale_;
    }
  }
  if (traceStartUs != 0) {
    trace::complete("ddp finalize", "ddp", traceStartUs, trace::nowUs(),
                    detail::str("\"iteration\": ", iterations_));
  }
  finishIteration();
}

void Reducer::finishIteration() {
  if (!rebuilt_) rebuildPending_ = true;
  ++iterations_;
  resetIteration();
}

// What a synced iteration issues, with zeros: the pending rebuild's broadcast, one hook start
// per bucket in bucket order (the hook's own collectives, e.g. PowerSGD's, follow), the waits,
// and the used-flags all-reduce when the ranks agree on unused parameters this iteration.
void Reducer::shadowBackward() {
  LOOM_CHECK(!expecting_, who(), ": shadowBackward while this rank's own backward is pending");
  if (rebuildPending_) rebuildFromObservedOrder();
  resetIteration();
  try {
    for (Bucket& b : buckets_) {
      std::fill_n(b.data(), b.count, 0.0f);
      startBucket(b);
    }
    for (Bucket& b : buckets_) {
      b.future->wait();
      traceBucketEnd(b);
    }
  } catch (...) {
    waitLaunched();
    resetIteration();
    throw;
  }
  if (!staticKnown_ && agreesOnUsed()) {
    std::vector<int32_t> used(params_.size(), 0);
    if (pg_->size() > 1 && !used.empty()) pg_->allreduce(view(used.data(), used.size()))->wait();
    // staticGraph: the others now know the set; so must this rank, or it would keep sending
    // flags they no longer expect.
    if (options_.staticGraph) {
      staticUnused_.clear();
      staticUnusedFlag_.assign(params_.size(), 0);
      staticGlobalUsed_ = used;
      staticKnown_ = true;
    }
  }
  finishIteration();
}

}  // namespace loom::ddp
