// Reducer: the gradient buckets behind DistributedDataParallel.
//
// How it works
// - Parameters (float32 leaves that require grad) are packed into buckets, flat float32
//   buffers. The first layout follows the reverse of registration order (the order gradients
//   usually become ready in); the first bucket holds at most `firstBucketCapMb`, the others at
//   most `bucketCapMb` (a parameter larger than the cap gets a bucket of its own).
// - Every parameter has a gradient-ready hook. In a synced iteration (prepareForBackward was
//   called), the hook marks the parameter's gradient ready in its slot of the bucket (copying
//   it there unless it already is a view of the slot, see gradientAsBucketView) and, when
//   the bucket is complete, starts the bucket's reduction through the comm hook. Buckets are
//   started strictly in index order (a complete bucket waits for the ones before it), so every
//   rank issues the same collectives in the same order while backward still runs.
// - At the first hook of a pass the reducer queues a callback with the autograd engine
//   (ag::queueCallback) that finalizes when the whole pass is done: it waits for every bucket
//   and leaves the averaged values in the parameters' grad() (views of the slots, or copies
//   without gradientAsBucketView), so backward() returns
//   with reduced gradients, or throws the unused-parameter error below. finalize() may also be
//   called after backward; it is a no-op when the iteration already finished.
// - After the first finished iteration, the order in which gradients became ready (rank 0's,
//   broadcast so that every rank agrees) replaces the initial layout, once, at the next
//   prepareForBackward: buckets then complete, and start, as early as backward allows.
// - Unused parameters: with findUnusedParameters, prepareForBackward walks the graph from
//   the outputs; parameters it does not reach are marked ready (with their current grad, or
//   zeros) when the first hook of the iteration fires, so their buckets can complete. Ranks
//   then agree (an all-reduce of used flags) on which parameters nobody used: those keep an
//   undefined grad() if they had none. Without the option, an iteration where some parameter
//   never got a gradient fails with an error that names those parameters, thrown out of that
//   backward (or, if no gradient arrived at all, at the next forward).
// - gradientAsBucketView (default on): a parameter's grad() is a view into its bucket slot
//   (autograd_lite storage over the bucket's memory), so backward accumulates straight into the
//   bucket and the reduced values are the gradients: nothing is copied in or out. A parameter
//   gets its view once it has a defined gradient (the first backward's gradient is copied in
//   once and the view set at the end of that iteration; after a bucket rebuild the values move
//   to the new bucket once); an undefined grad() stays undefined (optimizers skip it), and
//   zeroGrad(setToNone) drops the view until the next iteration re-attaches it. Off: the
//   gradient is copied into the bucket when ready and the reduced value copied back.
// - Outside synced iterations (noSync, or eval), the hooks do nothing: gradients accumulate in
//   grad(), and the next synced backward reduces the accumulated sum.
// - Timeline (LOOM_TRACE, loom/process_group/trace.h): each bucket's reduction is a span
//   "bucket <i> <hook>" (args bucket, bytes, iteration, and ready / params: how many of the
//   parameters' gradients were ready when it was launched) on a lane of its own per bucket index,
//   from the hook's start to the moment the reducer sees its communication complete (polled at
//   every gradient-ready hook and at finalize; a hook whose future cannot tell ends at its
//   wait), and finalize is a span "ddp finalize" on the backward thread: it starts when the
//   autograd pass has computed every gradient, so a bucket span that starts before it overlaps
//   backward. Without a trace this costs one relaxed load per hook.
// Thread-safety: one training thread (forward, backward and finalize on the same thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/autograd/tensor.h"
#include "loom/ddp/comm_hook.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

struct ReducerOptions {
  double bucketCapMb = 25.0;
  double firstBucketCapMb = 1.0;
  bool findUnusedParameters = false;
  bool staticGraph = false;
  bool gradientAsBucketView = true;
  // Buckets in Loom windows (loom/comm/window.h): the shared-memory all-reduce of a bucket
  // then reads and reduces the peers' buckets directly (one copy per byte instead of two, from
  // the window path's sizes, docs/shm.md). Every rank must choose alike. false: ordinary memory.
  bool windowBuckets = true;
  std::shared_ptr<CommHook> commHook;  // null: allreduceHook()
};

class Reducer {
 public:
  using NamedParameters = std::vector<std::pair<std::string, ag::Tensor>>;
  Reducer(NamedParameters parameters, std::shared_ptr<ProcessGroup> pg,
          const ReducerOptions& options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Arms the hooks for the backward of `outputs` (collective when a rebuild is pending).
  // Throws the unused-parameter error if the previous synced backward never finished.
  void prepareForBackward(const std::vector<ag::Tensor>& outputs);
  // Waits for every bucket and writes averaged gradients back; see the file comment.
  void finalize();
  void setCommHook(std::shared_ptr<CommHook> hook);
  // Join: see the file comment. shadowBackward is collective and waits for its collectives.
  void shadowBackward();
  void setGradientScale(float scale) { gradScale_ = scale; }

  size_t numBuckets() const { return buckets_.size(); }
  // Parameter names of bucket i, in layout order.
  std::vector<std::string> bucketParameterNames(size_t i) const;
  // Bucket i's flat storage and its length in floats.
  const float* bucketData(size_t i) const { return buckets_.at(i).storage.get(); }
  size_t bucketSize(size_t i) const { return buckets_.at(i).count; }
  bool rebuilt() const { return rebuilt_; }
  bool expectingBackward() const { return expecting_; }
  // Synced iterations finished (shadowed ones included).
  int64_t iterations() const { return iterations_; }
  // How many times prepareForBackward walked the graph looking for unused parameters.
  int64_t graphSearches() const { return graphSearches_; }

 private:
  struct Bucket {
    std::vector<size_t> params;   // indices into params_
    std::vector<size_t> offsets;  // float offset of each in data
    // `count` floats, in a Window (windowBuckets) or an array. Shared: with
    // gradientAsBucketView, parameters' grad() are views into it that keep it alive (even
    // across a rebuild, until they are re-attached).
    std::shared_ptr<float> storage;
    size_t count = 0;
    float* data() { return storage.get(); }
    size_t pending = 0;  // parameters not yet ready this iteration
    GradBucket view;
    std::unique_ptr<HookFuture> future;
    bool launched = false;
    int64_t traceStartUs = 0;  // LOOM_TRACE: when its hook started; 0 when not traced or ended
    size_t traceReady = 0;     // LOOM_TRACE: gradients ready (all buckets) at its launch
  };

  void buildBuckets(const std::vector<size_t>& order);
  void rebuildFromObservedOrder();
  void onGradReady(size_t param);
  void markReady(size_t param, bool fromHook);
  void launchReadyBuckets();
  void startBucket(Bucket& b);
  // LOOM_TRACE: ends b's span (no-op when it has none), or those of the buckets whose
  // communication completed.
  void traceBucketEnd(Bucket& b);
  void traceCompletedBuckets();
  void waitLaunched() noexcept;
  void resetIteration();
  void finishIteration();
  bool agreesOnUsed() const { return options_.findUnusedParameters || options_.staticGraph; }
  void searchUnused(const std::vector<ag::Tensor>& outputs);
  float* slot(size_t param) {
    return buckets_[bucketOf_[param]].data() + buckets_[bucketOf_[param]].offsets[slotOf_[param]];
  }
  ag::Tensor bucketView(size_t param);
  void attachGradViews();
  std::string who() const;

  NamedParameters params_;
  std::shared_ptr<ProcessGroup> pg_;
  ReducerOptions options_;
  std::vector<ag::HookHandle> hookHandles_;

  std::vector<Bucket> buckets_;
  std::vector<size_t> bucketOf_;  // param -> bucket
  std::vector<size_t> slotOf_;    // param -> position in its bucket

  bool expecting_ = false;
  bool firstHookSeen_ = false;
  bool finalizeQueued_ = false;
  size_t nextLaunch_ = 0;
  size_t readyCount_ = 0;
  std::vector<char> ready_;
  std::vector<char> locallyUsed_;
  std::vector<char> hadGrad_;
  std::vector<size_t> unused_;

  float gradScale_ = 1.0f;
  int64_t iterations_ = 0;
  int64_t graphSearches_ = 0;
  // staticGraph: what the first iteration found (staticKnown_ once it finished).
  bool staticKnown_ = false;
  std::vector<size_t> staticUnused_;       // locally unused in the first iteration
  std::vector<char> staticUnusedFlag_;     // per parameter
  std::vector<int32_t> staticGlobalUsed_;  // used on some rank in the first iteration

  bool rebuilt_ = false;
  bool rebuildPending_ = false;
  std::vector<size_t> readyOrder_;
  std::vector<int> traceLanes_;  // LOOM_TRACE: a lane per bucket index ("ddp bucket 3")
};

}  // namespace loom::ddp
