// DDP with ranks as forked processes (tcp groups over a FileStore): training matches one
// process, checkpoints round-trip (every rank reading, or rank 0 reading and broadcasting),
// optimizer state round-trips with the model, a failed save leaves no temporary file and every
// rank's error says why, and a writer SIGKILLed in the middle of a checkpoint write leaves the
// previous checkpoint intact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "ddp_test_util.h"
#include "loom/autograd/serialize.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/ddp/checkpoint.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/process_group/factory.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom::ddp {
namespace {

using namespace loom::ddp::testing;
using std::chrono::milliseconds;

// A tcp group over a FileStore in `dir`, with a 30 s timeout.
std::shared_ptr<ProcessGroup> fileStoreGroup(const loom::testing::TempDir& dir, int rank,
                                             int world) {
  auto store = std::make_shared<FileStore>(dir.file("store"));
  ProcessGroupOptions po;
  po.timeout = std::chrono::seconds(30);
  return createProcessGroup("tcp", store, rank, world, po);
}

// Throws (so the child exits 1 with the message) when a and b differ by more than tol.
void requireClose(const nn::NamedTensors& a, const nn::NamedTensors& b, double tol,
                  const std::string& what) {
  LOOM_CHECK_EQ(a.size(), b.size(), what);
  for (size_t i = 0; i < a.size(); ++i) {
    LOOM_CHECK_EQ(a[i].first, b[i].first, what);
    if (a[i].second.dtype() != ag::DType::kFloat32) continue;
    const float* x = a[i].second.data<float>();
    const float* y = b[i].second.data<float>();
    for (int64_t j = 0; j < a[i].second.numel(); ++j) {
      LOOM_CHECK(std::fabs(x[j] - y[j]) <= tol * std::max(1.0f, std::fabs(y[j])), what, ": ",
                 a[i].first, "[", j, "] = ", x[j], " vs ", y[j]);
    }
  }
}

nn::NamedTensors cloneState(const nn::Module& m) {
  nn::NamedTensors out;
  for (const auto& [name, t] : m.stateDict()) out.emplace_back(name, t.detach().clone());
  return out;
}

TEST(DdpProcesses, TrainAndCheckpointLikeOneProcess) {
  loom::testing::TempDir dir;
  const std::vector<int64_t> sizes{8, 10, 3};
  const int world = 2, steps = 3;
  const int64_t batch = 4;
  loom::testing::ChildProcesses ranks;
  ranks.spawnRanks(world, [&](int rank) {
    auto pg = fileStoreGroup(dir, rank, world);
    const Dataset d = makeData(world * batch * steps, sizes.front(), sizes.back());

    auto ref = makeMlp(sizes);
    ag::optim::SGD refOpt(ref->parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      refOpt.zeroGrad();
      ag::crossEntropy(ref->forward(rowsOf(d.x, s * world * batch, world * batch)),
                       rowsOf(d.labels, s * world * batch, world * batch))
          .backward();
      refOpt.step();
    }

    auto model = makeMlp(sizes, rank == 0 ? 7 : 100 + rank);  // rank 0 as the reference
    DistributedDataParallel ddp(model, pg);
    ag::optim::SGD opt(model->parameters(), 0.1);
    for (int s = 0; s < steps; ++s) {
      opt.zeroGrad();
      const int64_t begin = s * world * batch + rank * batch;
      ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch))
          .backward();
      opt.step();
    }
    requireClose(cloneState(*model), cloneState(*ref), 1e-5, "after training");

    const std::string path = dir.file("ckpt.safetensors");
    saveCheckpoint(*pg, path, *model, steps);
    LOOM_CHECK(std::filesystem::exists(path), "no checkpoint after the barrier");
    for (bool broadcast : {false, true}) {
      auto fresh = makeMlp(sizes, 500 + rank);
      const Checkpoint c = loadCheckpoint(*pg, path, *fresh, {}, broadcast);
      LOOM_CHECK_EQ(c.step, steps);
      requireClose(cloneState(*fresh), cloneState(*model), 0, "loaded checkpoint");
    }
    // A checkpoint of a different model is refused on every rank, naming the tensor.
    auto other = makeMlp({8, 11, 3});
    try {
      loadCheckpoint(*pg, path, *other, {}, true);
      LOOM_THROW(Error, "loading a mismatched checkpoint did not fail");
    } catch (const InvalidArgumentError& e) {
      if (rank == 0) {
        LOOM_CHECK(std::string(e.what()).find("0.weight") != std::string::npos, e.what());
      }
    }
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(60000)), "");
}

// Optimizer state travels with the model: Adam's moments and step counts (and a parameter whose
// state was never created) are restored on every rank, with every rank reading or with rank 0
// reading and broadcasting; a checkpoint of another optimizer kind is refused, naming the entry.
TEST(DdpProcesses, CheckpointWithOptimizerState) {
  loom::testing::TempDir dir;
  const std::vector<int64_t> sizes{8, 10, 3};
  const int world = 2;
  const int64_t batch = 4;
  loom::testing::ChildProcesses ranks;
  ranks.spawnRanks(world, [&](int rank) {
    auto pg = fileStoreGroup(dir, rank, world);
    const Dataset d = makeData(world * batch * 2, sizes.front(), sizes.back());
    auto model = makeMlp(sizes);
    DistributedDataParallel ddp(model, pg);
    auto withIdle = [](std::vector<ag::Tensor> ps) {
      ps.push_back(ag::zeros({2}).setRequiresGrad());  // never has a gradient
      return ps;
    };
    ag::optim::Adam opt(withIdle(model->parameters()), 0.01);
    for (int s = 0; s < 2; ++s) {
      opt.zeroGrad();
      const int64_t begin = s * world * batch + rank * batch;
      ag::crossEntropy(ddp.forward(rowsOf(d.x, begin, batch)), rowsOf(d.labels, begin, batch))
          .backward();
      opt.step();
    }
    const std::string path = dir.file("ckpt.safetensors");
    saveCheckpoint(*pg, path, *model, 2, opt);
    const nn::NamedTensors want = opt.stateDict();
    for (bool broadcast : {false, true}) {
      auto fresh = makeMlp(sizes, 500 + rank);
      ag::optim::Adam freshOpt(withIdle(fresh->parameters()), 0.5);
      const Checkpoint c = loadCheckpoint(*pg, path, *fresh, freshOpt, broadcast);
      LOOM_CHECK_EQ(c.step, 2);
      requireClose(cloneState(*fresh), cloneState(*model), 0, "loaded model");
      const nn::NamedTensors got = freshOpt.stateDict();
      LOOM_CHECK_EQ(got.size(), want.size(), "optimizer state entries");
      for (size_t i = 0; i < got.size(); ++i) {
        LOOM_CHECK_EQ(got[i].first, want[i].first);
        LOOM_CHECK(got[i].second.shape() == want[i].second.shape() &&
                       std::memcmp(got[i].second.rawData(), want[i].second.rawData(),
                                   want[i].second.nbytes()) == 0,
                   "optimizer entry ", want[i].first, " differs (broadcast ", broadcast, ")");
      }
      for (const auto& [name, t] : got) {
        LOOM_CHECK(name.rfind("state.4.", 0) != 0, "the idle parameter has state: ", name);
      }
    }
    ag::optim::SGD sgd(withIdle(model->parameters()), 0.1, {.momentum = 0.9});
    try {
      loadCheckpoint(*pg, path, *model, sgd, true);
      LOOM_THROW(Error, "loading Adam state into SGD did not fail");
    } catch (const InvalidArgumentError& e) {
      if (rank == 0) {
        LOOM_CHECK(std::string(e.what()).find("missing entry 'param_groups.0.momentum'") !=
                       std::string::npos,
                   e.what());
      }
    }
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(60000)), "");
}

// A save that fails on rank 0 (the rename: the checkpoint's name is taken by a non-empty
// directory) leaves no temporary file behind, and every rank's IoError carries rank 0's reason;
// a load that fails on rank 0 (a file that is not a checkpoint, broadcastFromRank0) likewise.
TEST(DdpProcesses, AFailedSaveLeavesNoTemporaryFileAndEveryRankSaysWhy) {
  loom::testing::TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  std::filesystem::create_directories(path + "/occupied");
  const std::string bad = dir.file("bad.safetensors");
  std::ofstream(bad) << "xyz";
  const int world = 2;
  loom::testing::ChildProcesses ranks;
  ranks.spawnRanks(world, [&](int rank) {
    auto pg = fileStoreGroup(dir, rank, world);
    auto model = makeMlp({8, 10, 3});
    ag::optim::SGD opt(model->parameters(), 0.1);
    for (bool withOptimizer : {false, true}) {
      try {
        if (withOptimizer) {
          saveCheckpoint(*pg, path, *model, 1, opt);
        } else {
          saveCheckpoint(*pg, path, *model, 1);
        }
        LOOM_THROW(Error, "saving over a non-empty directory did not fail");
      } catch (const IoError& e) {
        const std::string what = e.what();
        LOOM_CHECK(what.find("rename " + path + ".tmp-") != std::string::npos &&
                       what.find(std::strerror(EISDIR)) != std::string::npos,
                   "rank ", rank, " does not say why: ", what);
        LOOM_CHECK(rank == 0 || what.find("rank 0 failed to write the checkpoint " + path) !=
                                    std::string::npos,
                   what);
      }
    }
    try {
      loadCheckpoint(*pg, bad, *model, {}, true);
      LOOM_THROW(Error, "loading a file that is not a checkpoint did not fail");
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      LOOM_CHECK(what.find(bad + ": not a safetensors file") != std::string::npos, "rank ", rank,
                 " does not say why: ", what);
      LOOM_CHECK(
          rank == 0 || what.find("rank 0 failed to load checkpoint " + bad) != std::string::npos,
          what);
    }
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(60000)), "");
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << "left behind: " << entry.path();
  }
}

// Every tensor of a checkpoint written at step s holds the value s, so a torn or mixed file
// is detected.
std::shared_ptr<nn::Sequential> filled(double value) {
  auto model = makeMlp({256, 256, 64});
  for (auto& [name, t] : model->stateDict()) t.fill(value);
  return model;
}

void expectConsistent(const std::string& path) {
  std::map<std::string, std::string> meta;
  const nn::NamedTensors tensors = ag::loadSafetensors(path, &meta);
  ASSERT_EQ(tensors.size(), 4u);
  const double step = std::stod(meta.at("step"));
  for (const auto& [name, t] : tensors) {
    const float* d = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      ASSERT_EQ(d[i], step) << name << "[" << i << "] of the checkpoint at step " << step;
    }
  }
}

// A writer SIGKILLed mid-write leaves the previous checkpoint whole, and its temporary file
// (nothing runs to remove it); the next write of that path on this host removes the files of
// writers that are gone, and leaves a live writer's and another host's.
TEST(DdpProcesses, SigkillMidWriteLeavesTheOldCheckpoint) {
  loom::testing::TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  writeCheckpointFile(path, *filled(0), 0);
  const std::string tmpOf = path + ".tmp-" + net::hostname() + "-";
  int killedMidWrite = 0;
  for (int round = 0; round < 5; ++round) {
    loom::testing::ChildProcesses writer;
    writer.spawn([&] {
      for (int64_t step = 1;; ++step) writeCheckpointFile(path, *filled(step), step);
    });
    const std::string tmp = tmpOf + std::to_string(writer.pid(0));
    // Kill as soon as a write is in progress (its temporary file exists), after a few writes.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int seen = 0;
    bool wasWriting = false;
    while (std::chrono::steady_clock::now() < deadline) {
      const bool writing = std::filesystem::exists(tmp) || std::filesystem::exists(tmp + ".tmp");
      if (writing && !wasWriting) ++seen;
      wasWriting = writing;
      if (writing && seen > round + 1) break;
    }
    writer.kill(0, SIGKILL);
    const auto exit = writer.wait(0, milliseconds(10000));
    EXPECT_EQ(exit.signal, SIGKILL) << exit.describe();
    if (std::filesystem::exists(tmp) || std::filesystem::exists(tmp + ".tmp")) ++killedMidWrite;
    expectConsistent(path);
  }
  // The kills must actually have landed inside writes for the test to mean anything.
  EXPECT_GE(killedMidWrite, 1);
  // A live writer's file (a process still running) and another host's stay.
  loom::testing::ChildProcesses live;
  live.spawn([&] { FileStore(dir.file("store")).wait({"done"}, std::chrono::seconds(60)); });
  const std::string liveTmp = tmpOf + std::to_string(live.pid(0));
  const std::string otherHost = path + ".tmp-elsewhere.example-" + std::to_string(::getpid());
  std::ofstream(liveTmp) << "x";
  std::ofstream(otherHost) << "x";
  writeCheckpointFile(path, *filled(7), 7);
  expectConsistent(path);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().string();
    if (name.find(".tmp") != std::string::npos) left.push_back(name);
  }
  std::sort(left.begin(), left.end());
  std::vector<std::string> kept = {liveTmp, otherHost};
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(left, kept);
  FileStore(dir.file("store")).set("done", "1");
  EXPECT_EQ(live.waitAllOk(milliseconds(60000)), "");
}

}  // namespace
}  // namespace loom::ddp
