// Shrink in place for loom-train (--shrink-on-failure): when a collective fails because a peer
// died, the survivors form a smaller group and go on from the last step they all finished,
// without a restart. docs/elastic.md ("Shrink in loom-train") is the user's view.
//
// How it works, in the words the code uses:
// - Before every step, each rank takes a `StepSnapshot` of what the step changes: the model's
//   state dict (parameters and buffers), the optimizer's state dict and the scheduler's epoch.
//   `SnapshotRing` keeps two: before the current step and before the previous one. A survivor
//   is at most one step ahead of another (every step ends in collectives over the whole group:
//   a rank that saw its step's last all-reduce complete may be ahead of one whose all-reduce
//   failed), so the step they agree on is always one of those two.
// - `shrinkAfterFailure` runs on every survivor after the failed step: it asks the failure
//   diagnosis which ranks are dead (their heartbeat names a process that no longer exists on
//   this host) and passes them to shrinkGroup as excludeRanks, so the survivors do not wait the
//   join window for them; ranks whose state is unknown (another host, heartbeats off) are
//   waited for at most the window. Then, on the new group, an all-reduce with kMin of each
//   survivor's count of finished steps gives `resumeStep`: a step counts only when every rank
//   of the quorum finished it.
// - The caller restores the snapshot before `resumeStep`, rebuilds DDP on the new group and
//   re-splits its sampler over the survivors, exactly as a run of that size resumed from a
//   checkpoint at `resumeStep` would.
//
// Not thread-safe; collective over the survivors like shrinkGroup (shrink.h in process_group).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/autograd/nn.h"
#include "loom/autograd/optim.h"
#include "loom/process_group/process_group.h"

namespace loom::train {

// The state before step `step` (after `step` steps), deep-copied.
struct StepSnapshot {
  int64_t step = -1;  // -1: empty
  ag::nn::NamedTensors model;
  ag::nn::NamedTensors optimizer;
  int64_t schedulerEpoch = 0;
  size_t bytes() const;
};

class SnapshotRing {
 public:
  // Takes the snapshot before `step` into the older slot, reusing its memory for the model.
  void take(int64_t step, const ag::nn::Module& model, const ag::optim::Optimizer& optimizer,
            const ag::optim::LRScheduler* scheduler);
  // The snapshot before `step`, or nullptr when neither slot holds it.
  const StepSnapshot* before(int64_t step) const;
  // What taking one costs: bytes copied (the latest snapshot), and the mean time per take.
  size_t bytesPerSnapshot() const;
  double meanMillis() const;
  int64_t taken() const { return taken_; }

 private:
  StepSnapshot slots_[2];
  int next_ = 0;
  int64_t taken_ = 0;
  double totalMillis_ = 0;
};

struct ShrinkSettings {
  std::chrono::milliseconds joinWindow{10000};
  int minRanks = 1;
};

struct ShrinkResult {
  std::shared_ptr<ProcessGroup> group;
  // The members' ranks at launch (RANK), in the new group's rank order.
  std::vector<int> launchRanks;
  // The ranks lost by this shrink, by launch rank, each with why: the diagnosis' note for a
  // rank found dead, or that it did not join within the window.
  std::vector<std::pair<int, std::string>> lost;
  int64_t resumeStep = 0;
  // From the call until resumeStep was agreed: the dead-rank lookup, shrinkGroup (the new
  // group connected) and the agreement.
  std::chrono::milliseconds took{0};
};

// Collective over the survivors of `broken` (every live rank calls it after its step failed
// with an IoError). `launchRanks[r]` is rank r's launch rank; `finishedSteps` how many steps
// this rank completed. Throws IoError when fewer than settings.minRanks survive (naming them),
// when this rank was excluded (it came late), or when the store is gone (the rank that hosted
// it died).
ShrinkResult shrinkAfterFailure(ProcessGroup& broken, const std::vector<int>& launchRanks,
                                int64_t finishedSteps, const ShrinkSettings& settings);

// "0,1,3"
std::string joinRanks(const std::vector<int>& ranks);

// --test-kill RANK:STEP (test-only), parsed; a malformed spec is an InvalidArgumentError.
struct KillPoint {
  int rank = 0;
  int64_t step = 0;
};
std::vector<KillPoint> parseKills(const std::vector<std::string>& specs);

// Keeps the header and the rows of steps <= `step` of the CSV log at `path` (the steps after it
// are trained again after a shrink or a resume, and logged then). The rows are written to
// path.tmp and renamed over the log; a failure removes path.tmp, leaves the log as it was and
// throws loom::Error naming the file and errno.
void truncateLog(const std::string& path, int64_t step);

}  // namespace loom::train
