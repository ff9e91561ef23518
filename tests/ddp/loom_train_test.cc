// loom-train end to end, ranks as processes started with the launcher's environment:
// per-step losses and final weights equal PyTorch DDP's (gloo, 2 ranks) from the same initial
// weights and data (fixtures/make_torch_ddp_reference.py), with and without --accumulate, and
// --resume continues a run exactly: model, optimizer state (SGD momentum, Adam moments and
// step counts) and step come back from the checkpoint.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/autograd/npy.h"
#include "loom/autograd/serialize.h"
#include "loom/testing/ranks.h"

namespace {

using std::chrono::milliseconds;
const std::string kFixtures = std::string(LOOM_DDP_FIXTURES) + "/torch_ddp/";
// 32 ports per test binary (it uses 26), below Linux's ephemeral range (32768 and up), so that
// neither concurrent binaries nor outgoing connections take a rank 0's port.
int nextPort = 19000 + static_cast<int>(::getpid() % 400) * 32;

// Runs loom-train on `world` process ranks; returns "" or a description of the failures.
std::string runLoomTrain(int world, const std::vector<std::string>& args) {
  loom::testing::ChildProcesses ranks;
  const int port = nextPort++;
  for (int r = 0; r < world; ++r) {
    ranks.spawn([&, r] {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<std::string> all{LOOM_TRAIN_BIN};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    });
  }
  return ranks.waitAllOk(milliseconds(60000));
}

std::vector<double> readLosses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> losses;
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,loss") << path;
  while (std::getline(in, line)) {
    const auto comma = line.find(',');
    EXPECT_EQ(std::stoi(line.substr(0, comma)), static_cast<int>(losses.size()) + 1) << line;
    losses.push_back(std::stod(line.substr(comma + 1)));
  }
  return losses;
}

void expectSameLosses(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::fabs(expected[i])) << "step " << i + 1;
  }
}

std::vector<std::string> commonArgs(const std::string& dir) {
  return {"--in",
          "8",
          "--hidden",
          "6,5",
          "--classes",
          "3",
          "--batch",
          "4",
          "--lr",
          "0.1",
          "--no-shuffle",
          "--data",
          kFixtures + "x.npy",
          "--labels",
          kFixtures + "y.npy",
          "--init-weights",
          kFixtures + "init.safetensors",
          "--checkpoint-dir",
          dir};
}

TEST(LoomTrain, MatchesPyTorchDdp) {
  for (int accumulate : {1, 2}) {
    loom::testing::TempDir dir;
    auto args = commonArgs(dir.path());
    for (std::string a : {"--momentum", "0.9", "--steps", "8", "--log"}) args.push_back(a);
    args.push_back(dir.file("loss.csv"));
    args.push_back("--accumulate");
    args.push_back(std::to_string(accumulate));
    ASSERT_EQ(runLoomTrain(2, args), "");
    SCOPED_TRACE("accumulate " + std::to_string(accumulate));
    expectSameLosses(
        readLosses(dir.file("loss.csv")),
        readLosses(kFixtures + (accumulate == 1 ? "losses.csv" : "losses_accumulate2.csv")));
    if (accumulate != 1) continue;
    // Final weights, flattened in state-dict order, as PyTorch left them.
    const auto tensors = loom::ag::loadSafetensors(dir.file("checkpoint.safetensors"));
    const loom::ag::Tensor expected = loom::ag::loadNpy(kFixtures + "final.npy");
    int64_t offset = 0;
    for (const auto& [name, t] : tensors) {
      if (name.rfind("model.", 0) != 0) continue;  // optimizer state follows
      for (int64_t i = 0; i < t.numel(); ++i, ++offset) {
        ASSERT_LT(offset, expected.numel());
        const float e = expected.data<float>()[offset];
        EXPECT_NEAR(t.data<float>()[i], e, 1e-5 * std::max(1.0f, std::fabs(e))) << name << i;
      }
    }
    EXPECT_EQ(offset, expected.numel());
  }
}

TEST(LoomTrain, ResumeContinuesTheRun) {
  loom::testing::TempDir whole, split;
  auto a = commonArgs(whole.path());
  for (std::string s : {"--steps", "8", "--log"}) a.push_back(s);
  a.push_back(whole.file("loss.csv"));
  ASSERT_EQ(runLoomTrain(2, a), "");
  auto b = commonArgs(split.path());
  for (std::string s : {"--steps", "5", "--log"}) b.push_back(s);
  b.push_back(split.file("loss.csv"));
  ASSERT_EQ(runLoomTrain(2, b), "");
  b[b.size() - 3] = "8";
  b.push_back("--resume");
  ASSERT_EQ(runLoomTrain(2, b), "");
  expectSameLosses(readLosses(split.file("loss.csv")), readLosses(whole.file("loss.csv")));
}

// N steps straight vs K steps, checkpoint, and a new process group resuming for N - K more: the
// same losses and bitwise the same final checkpoint (model and optimizer state).
void expectExactResume(const std::vector<std::string>& optimizerArgs, bool shuffle = false) {
  loom::testing::TempDir whole, split;
  auto withShuffle = [&](std::vector<std::string> args) {
    if (shuffle) args.erase(std::find(args.begin(), args.end(), "--no-shuffle"));
    return args;
  };
  auto a = withShuffle(commonArgs(whole.path()));
  a.insert(a.end(), optimizerArgs.begin(), optimizerArgs.end());
  for (std::string s : {"--steps", "8", "--log"}) a.push_back(s);
  a.push_back(whole.file("loss.csv"));
  ASSERT_EQ(runLoomTrain(2, a), "");
  auto b = withShuffle(commonArgs(split.path()));
  b.insert(b.end(), optimizerArgs.begin(), optimizerArgs.end());
  for (std::string s : {"--steps", "3", "--log"}) b.push_back(s);
  b.push_back(split.file("loss.csv"));
  ASSERT_EQ(runLoomTrain(2, b), "");
  b[b.size() - 3] = "8";
  b.push_back("--resume");
  ASSERT_EQ(runLoomTrain(2, b), "");
  const auto wantLosses = readLosses(whole.file("loss.csv"));
  const auto gotLosses = readLosses(split.file("loss.csv"));
  ASSERT_EQ(gotLosses.size(), wantLosses.size());
  for (size_t i = 0; i < gotLosses.size(); ++i) {
    EXPECT_EQ(gotLosses[i], wantLosses[i]) << "step " << i + 1;
  }
  const auto want = loom::ag::loadSafetensors(whole.file("checkpoint.safetensors"));
  const auto got = loom::ag::loadSafetensors(split.file("checkpoint.safetensors"));
  ASSERT_EQ(got.size(), want.size());
  bool sawOptimizerState = false;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    sawOptimizerState |= got[i].first.rfind("optim.state.", 0) == 0;
    ASSERT_EQ(got[i].second.nbytes(), want[i].second.nbytes()) << want[i].first;
    EXPECT_EQ(
        std::memcmp(got[i].second.rawData(), want[i].second.rawData(), want[i].second.nbytes()), 0)
        << want[i].first << " differs";
  }
  EXPECT_TRUE(sawOptimizerState);
  if (std::find(optimizerArgs.begin(), optimizerArgs.end(), "--lr-schedule") !=
      optimizerArgs.end()) {
    bool sawEpoch = false;
    for (const auto& [name, t] : got) {
      if (name != "sched.epoch") continue;
      sawEpoch = true;
      EXPECT_EQ(t.item(), 8);
    }
    EXPECT_TRUE(sawEpoch) << "no sched.epoch in the checkpoint";
  }
}

TEST(LoomTrain, ResumeIsExactWithSgdMomentum) {
  expectExactResume({"--momentum", "0.9", "--nesterov", "--weight-decay", "0.01"});
}

TEST(LoomTrain, ResumeIsExactWithAdam) {
  expectExactResume({"--optimizer", "adam"});
}

TEST(LoomTrain, ResumeIsExactWithAdamW) {
  expectExactResume({"--optimizer", "adamw", "--weight-decay", "0.1"});
}

// Shuffled data (5 batches per rank per epoch: the 8 steps cross an epoch after the resume at
// step 3) and a StepLR schedule whose lr halves every 2 steps; the checkpoint carries
// sched.epoch, and the resumed run's losses and final checkpoint are bitwise the uninterrupted
// run's.
TEST(LoomTrain, ResumeIsExactWithShuffleAndAScheduler) {
  expectExactResume({"--momentum", "0.9", "--lr-schedule", "step:2:0.5"}, true);
  expectExactResume({"--optimizer", "adam", "--lr-schedule", "cosine:8:0.001"}, true);
}

// --zero (ZeRO-1) trains as plain DDP does (the same losses), and resumes bitwise exactly from
// its consolidated checkpoint with shuffle on and a scheduler.
TEST(LoomTrain, ZeroMatchesPlainDdpAndResumesExactly) {
  loom::testing::TempDir plain, zero;
  std::vector<std::vector<double>> losses;
  for (auto* dir : {&plain, &zero}) {
    auto args = commonArgs(dir->path());
    for (std::string s : {"--optimizer", "adam", "--steps", "8", "--log"}) {
      args.push_back(s);
    }
    args.push_back(dir->file("loss.csv"));
    if (dir == &zero) args.push_back("--zero");
    ASSERT_EQ(runLoomTrain(2, args), "");
    losses.push_back(readLosses(dir->file("loss.csv")));
  }
  expectSameLosses(losses[1], losses[0]);
  expectExactResume({"--zero", "--optimizer", "adam", "--lr-schedule", "step:2:0.5"}, true);
}

TEST(LoomTrain, BadFlagsAreNamed) {
  loom::testing::TempDir dir;
  auto args = commonArgs(dir.path());
  args[1] = "9";  // --in 9 does not match x.npy's 8 columns
  EXPECT_NE(runLoomTrain(1, args), "");
}

}  // namespace
