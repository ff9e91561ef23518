// DDP training that goes on in place after a rank dies: the recipe docs/elastic.md describes,
// run with the real DDP stack (a new test folder, so that ddp/ and loom-train stay as they
// are).
//
// Four forked ranks train an MLP with DistributedDataParallel and SGD with momentum over a
// FileStore. Rank 3 SIGKILLs itself in the middle of step 5 (after its forward, or after its
// optimizer step). The survivors:
//   1. catch the IoError, shrinkGroup the broken group into ranks [0, 1, 2];
//   2. agree on the last step every survivor finished (an all-reduce with kMin of each one's
//      count of finished steps) and restore the snapshot of the model and the optimizer taken
//      before that step (each rank keeps the snapshots before its current and its previous
//      step: a survivor is at most one step ahead of another, since every step ends in
//      collectives on the whole group);
//   3. rebuild DDP on the new group and re-split the sampler over 3 ranks, and train to the end.
// Then three fresh ranks resume from the 4-rank group's checkpoint of the state before the
// agreed step and train to the end; their final weights must equal the survivors' bit for bit.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "loom/autograd/nn.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/optim.h"
#include "loom/common/error.h"
#include "loom/ddp/checkpoint.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/eval.h"
#include "loom/ddp/sampler.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/shrink.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

namespace nn = ag::nn;
using std::chrono::milliseconds;
using testing::ChildProcesses;
using testing::TempDir;

constexpr int kWorld = 4;
constexpr int kVictim = 3;
constexpr int64_t kKillStep = 5;
constexpr int64_t kSteps = 14;
constexpr int64_t kSamples = 120, kIn = 6, kClasses = 3, kBatch = 2;
constexpr milliseconds kChildDeadline(120000);

void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

struct Data {
  ag::Tensor x = ag::empty({kSamples, kIn});
  ag::Tensor y = ag::empty({kSamples}, ag::DType::kInt64);
  Data() {
    auto* xs = static_cast<float*>(x.rawData());
    auto* ys = static_cast<int64_t*>(y.rawData());
    for (int64_t i = 0; i < kSamples; ++i) {
      for (int64_t j = 0; j < kIn; ++j) xs[i * kIn + j] = std::sin(0.7f * i + 1.3f * j);
      ys[i] = (i * 7 + i / 5) % kClasses;
    }
  }
};

// The model, its optimizer and DDP over the current group.
struct Trainer {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<ag::optim::SGD> optimizer;
  std::shared_ptr<ProcessGroup> pg;
  std::unique_ptr<ddp::DistributedDataParallel> ddpModel;
  Data data;
  ag::Tensor x = ag::empty({kBatch, kIn});
  ag::Tensor y = ag::empty({kBatch}, ag::DType::kInt64);

  Trainer() {
    nn::LinearOptions first, second;
    first.seed = 11;
    second.seed = 12;
    model->append(std::make_shared<nn::Linear>(kIn, 16, first));
    model->append(std::make_shared<nn::ReLU>());
    model->append(std::make_shared<nn::Linear>(16, kClasses, second));
    ag::optim::SGDOptions so;
    so.momentum = 0.9;
    optimizer = std::make_unique<ag::optim::SGD>(model->parameters(), 0.05, so);
  }

  void attach(std::shared_ptr<ProcessGroup> group) {
    ddpModel.reset();  // its hooks leave the parameters before the new ones arrive
    pg = std::move(group);
    ddpModel = std::make_unique<ddp::DistributedDataParallel>(model, pg);
  }

  // The batch of `step` for this rank under the group's sampler (re-split when the group
  // changes), forward, backward (DDP averages the gradients), optimizer step, mean loss.
  // `at(where)` runs at "forward" (after it) and "update" (after the optimizer step).
  void step(int64_t step, const std::function<void(const std::string&)>& at = {}) {
    ddp::DistributedSampler sampler(kSamples, pg->size(), pg->rank(), true, 5, true);
    const int64_t perEpoch = sampler.numSamples() / kBatch;
    sampler.setEpoch(step / perEpoch);
    const std::vector<int64_t> indices = sampler.indices();
    const int64_t pos = (step % perEpoch) * kBatch;
    for (int64_t i = 0; i < kBatch; ++i) {
      const int64_t row = indices[static_cast<size_t>(pos + i)];
      std::memcpy(static_cast<float*>(x.rawData()) + i * kIn,
                  static_cast<const float*>(data.x.rawData()) + row * kIn, kIn * sizeof(float));
      static_cast<int64_t*>(y.rawData())[i] = static_cast<const int64_t*>(data.y.rawData())[row];
    }
    optimizer->zeroGrad();
    ag::Tensor loss = ag::crossEntropy(ddpModel->forward(x), y);
    if (at) at("forward");
    loss.backward();
    ddpModel->finalize();
    optimizer->step();
    if (at) at("update");
    ddp::reduceMean(*pg, loss.item());
  }

  std::string weights() const {
    std::string out;
    for (const auto& [name, t] : model->stateDict()) {
      out.append(static_cast<const char*>(t.rawData()), t.nbytes());
    }
    return out;
  }
};

// Model and optimizer state, deep-copied.
struct Snapshot {
  nn::NamedTensors model, optimizer;
  static Snapshot take(const Trainer& t) {
    Snapshot s;
    for (const auto& [name, tensor] : t.model->stateDict())
      s.model.emplace_back(name, tensor.clone());
    for (const auto& [name, tensor] : t.optimizer->stateDict()) {
      s.optimizer.emplace_back(name, tensor.clone());
    }
    return s;
  }
  void restore(Trainer& t) const {
    t.model->loadStateDict(model);
    t.optimizer->loadStateDict(optimizer);
  }
};

std::shared_ptr<ProcessGroup> group(const std::string& path, int rank, int size) {
  FileStoreOptions so;
  so.timeout = milliseconds(60000);
  ProcessGroupOptions options;
  options.timeout = milliseconds(20000);
  return createProcessGroup("tcp", std::make_shared<FileStore>(path, so), rank, size, options);
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Where the victim dies in step kKillStep: after its forward (nobody finishes the step), or
// after its optimizer step (the survivors' gradient all-reduce completed and they updated their
// weights, then the loss all-reduce failed: they must undo the update).
class DdpShrink : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpShrink, SurvivorsResumeFromTheLastStepAllFinishedAndMatchAResumedRun) {
  const std::string killAt = GetParam();
  TempDir dir;
  auto before = [&](int64_t step) { return dir.file("before." + std::to_string(step)); };
  {
    ChildProcesses children;
    children.spawnRanks(kWorld, [&](int rank) {
      Trainer t;
      t.attach(group(dir.file("store"), rank, kWorld));
      Snapshot previous, current = Snapshot::take(t);
      int64_t finished = 0;
      for (int64_t s = 0; s < kSteps;) {
        // The state every rank had before step s, kept by the 4-rank group's rank 0 (all ranks
        // finished step s-1, so they agree): the reference resumes from one of these.
        if (t.pg->size() == kWorld && rank == 0) {
          ddp::writeCheckpointFile(before(s), *t.model, s, *t.optimizer);
        }
        previous = std::move(current);
        current = Snapshot::take(t);
        try {
          t.step(s, [&](const std::string& where) {
            if (rank == kVictim && s == kKillStep && where == killAt) raise(SIGKILL);
          });
          finished = s + 1;
          ++s;
          continue;
        } catch (const IoError&) {
        }
        require(finished == s, "failed in step " + std::to_string(s));
        ShrinkOptions so;
        so.joinWindow = milliseconds(10000);
        auto survivors = shrinkGroup(*t.pg, so);
        int64_t resume = finished;
        survivors->allreduce(view(&resume, 1), {.reduceOp = ReduceOp::kMin})->wait();
        require(resume == s || resume == s - 1, "resume step " + std::to_string(resume));
        (resume == s ? current : previous).restore(t);
        t.attach(survivors);
        s = finished = resume;
        if (t.pg->rank() == 0) writeFile(dir.file("resume_step"), std::to_string(resume));
      }
      require(t.pg->size() == kWorld - 1, "the group did not shrink");
      writeFile(dir.file("survivor." + std::to_string(t.pg->rank())), t.weights());
      t.pg->barrier()->wait();
    });
    const auto exits = children.waitAll(kChildDeadline);
    for (int rank = 0; rank < kWorld; ++rank) {
      if (rank == kVictim) {
        EXPECT_EQ(exits[rank].signal, SIGKILL) << exits[rank].describe();
      } else {
        EXPECT_TRUE(exits[rank].ok()) << "rank " << rank << ": " << exits[rank].describe();
      }
    }
  }
  const std::string resumeText = readFile(dir.file("resume_step"));
  ASSERT_FALSE(resumeText.empty());
  const int64_t resume = std::stoll(resumeText);
  EXPECT_EQ(resume, kKillStep);

  // The reference: three ranks resumed from the 4-rank group's state before the agreed step.
  const std::string ckpt = before(resume);
  ChildProcesses reference;
  reference.spawnRanks(kWorld - 1, [&](int rank) {
    Trainer t;
    t.attach(group(dir.file("store_reference"), rank, kWorld - 1));
    const int64_t from = ddp::loadCheckpoint(*t.pg, ckpt, *t.model, *t.optimizer, true).step;
    require(from == resume, "the checkpoint is at step " + std::to_string(from));
    for (int64_t s = from; s < kSteps; ++s) t.step(s);
    writeFile(dir.file("reference." + std::to_string(rank)), t.weights());
    t.pg->barrier()->wait();
  });
  EXPECT_EQ(reference.waitAllOk(kChildDeadline), "");

  const std::string want = readFile(dir.file("reference.0"));
  ASSERT_FALSE(want.empty());
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    EXPECT_TRUE(readFile(dir.file("survivor." + std::to_string(rank))) == want)
        << "survivor " << rank << "'s final weights differ from the resumed 3-rank run's";
    EXPECT_TRUE(readFile(dir.file("reference." + std::to_string(rank))) == want) << rank;
  }
  // Training moved the weights away from the checkpoint (the comparison is not vacuous).
  Trainer start;
  EXPECT_FALSE(start.weights() == want);
}

INSTANTIATE_TEST_SUITE_P(KillPoints, DdpShrink, ::testing::Values("forward", "update"));

}  // namespace
}  // namespace loom
