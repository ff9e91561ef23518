// loom-train --model gpt and --model cnn end to end on 2 process ranks (the launcher's
// environment): a short run lowers the loss and reports a validation result (and, for the gpt,
// sampled text); --resume from a mid-run checkpoint gives the same per-step losses as the
// uninterrupted run; bad model flags fail with a message that names them; a --log write that
// fails is an error naming the log, and a failed rewrite on --resume leaves the log as it was.
// Small models and few steps, so each run takes seconds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/autograd/serialize.h"
#include "loom/testing/ranks.h"
#include "loom_train_ranks.h"

namespace {

using loom::testing::readLosses;
using std::chrono::milliseconds;

// Runs loom-train on 2 process ranks, rank 0's stdout into `out`; "" or the failures.
std::string runLoomTrain(const std::vector<std::string>& args, const std::string& out) {
  return loom::testing::runLoomTrainRanks(
      args, {.world = 2,
             .port = loom::testing::freePort(),
             .env = {{"LOOM_AUTOGRAD_THREADS", "1"}},
             .stdoutPath = [&](int r) { return r == 0 ? out : std::string("/dev/null"); },
             .deadline = milliseconds(90000)});
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Single process (no launcher environment); returns the exit status and stdout + stderr.
// `shell` runs before it, in the same shell (limits it inherits).
std::pair<int, std::string> runSingle(const std::string& args, const std::string& shell = "") {
  const std::string cmd = shell + "exec " + std::string(LOOM_TRAIN_BIN) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

// A whole run of `steps`, then the same run stopped at steps / 2 and resumed: the losses
// decrease and the resumed run's losses are the whole run's, step for step.
void checkDecreasesAndResumesExactly(const std::vector<std::string>& model, int steps,
                                     const std::string& expectInOutput,
                                     const std::vector<std::string>& expectParameters) {
  loom::testing::TempDir whole, split;
  auto args = [&](const loom::testing::TempDir& dir, int n) {
    std::vector<std::string> a = model;
    for (const std::string& s :
         {std::string("--steps"), std::to_string(n), std::string("--log"), dir.file("loss.csv"),
          std::string("--checkpoint-dir"), dir.path()}) {
      a.push_back(s);
    }
    return a;
  };
  ASSERT_EQ(runLoomTrain(args(whole, steps), whole.file("out.txt")), "");
  const std::vector<double> losses = readLosses(whole.file("loss.csv"));
  ASSERT_EQ(losses.size(), static_cast<size_t>(steps));
  EXPECT_LT(mean(losses, steps - 3, steps), mean(losses, 0, 3)) << readFile(whole.file("loss.csv"));
  const std::string out = readFile(whole.file("out.txt"));
  EXPECT_NE(out.find("step " + std::to_string(steps) + " validation loss"), std::string::npos)
      << out;
  EXPECT_NE(out.find(expectInOutput), std::string::npos) << out;

  // The checkpoint holds the model under PyTorch's names for the same module tree.
  std::vector<std::string> names;
  for (const auto& [name, t] : loom::ag::loadSafetensors(whole.file("checkpoint.safetensors"))) {
    names.push_back(name);
  }
  for (const auto& want : expectParameters) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }

  ASSERT_EQ(runLoomTrain(args(split, steps / 2), split.file("out1.txt")), "");
  auto resumed = args(split, steps);
  resumed.push_back("--resume");
  ASSERT_EQ(runLoomTrain(resumed, split.file("out2.txt")), "");
  const std::vector<double> again = readLosses(split.file("loss.csv"));
  ASSERT_EQ(again.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(again[i], losses[i]) << "step " << i + 1;
  // The validation pass at the end saw the same weights.
  const std::string tail = readFile(split.file("out2.txt"));
  const auto line = [](const std::string& text) {
    const auto at = text.find("validation loss");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  EXPECT_EQ(line(tail), line(out));
}

std::vector<std::string> smallGpt() {
  // A repository document as the corpus: any text does, and this one is always there.
  return {"--model",        "gpt", "--text",       std::string(LOOM_SOURCE_DIR) + "/docs/ddp.md",
          "--layers",       "2",   "--heads",      "2",
          "--width",        "32",  "--context",    "32",
          "--batch",        "8",   "--lr",         "1e-2",
          "--sample-chars", "40",  "--eval-batch", "16"};
}

TEST(LoomTrainModels, GptLearnsAndResumesExactly) {
  checkDecreasesAndResumesExactly(
      smallGpt(), 12, "loom-train: sample (temperature 0.80, 40 characters):",
      {"model.wte.weight", "model.wpe.weight", "model.h.0.ln_1.weight", "model.h.1.attn.qkv.weight",
       "model.h.1.attn.proj.bias", "model.h.1.mlp.fc.weight", "model.h.1.mlp.proj.bias",
       "model.ln_f.bias", "model.lm_head.weight"});
}

// --amp: the gpt trains under autocast (fp16 with its loss scaler, bf16), evaluates in float32,
// samples, and resumes exactly.
TEST(LoomTrainModels, GptWithAmpLearnsAndResumesExactly) {
  for (const char* amp : {"fp16", "bf16"}) {
    SCOPED_TRACE(amp);
    std::vector<std::string> args = smallGpt();
    args.push_back("--amp");
    args.push_back(amp);
    checkDecreasesAndResumesExactly(args, 12,
                                    std::string("loom-train: mixed precision ") + amp +
                                        " (autocast to " +
                                        (amp == std::string("fp16") ? "float16" : "bfloat16"),
                                    {"model.lm_head.weight"});
  }
}

TEST(LoomTrainModels, CnnLearnsAndResumesExactly) {
  loom::testing::TempDir data;
  const std::string cmd = std::string("/usr/bin/python3 ") + LOOM_SOURCE_DIR +
                          "/examples/loom_train/data/make_digits.py " + data.path() + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  checkDecreasesAndResumesExactly(
      {"--model", "cnn", "--data-dir", data.path(), "--batch", "16", "--lr", "3e-3"}, 20,
      "accuracy", {"model.0.weight", "model.0.bias", "model.3.weight", "model.7.weight"});
}

TEST(LoomTrainModels, BadFlagsAreNamed) {
  auto [code, out] = runSingle("--model gpt --hidden 10");
  EXPECT_EQ(code, 2);  // a usage error, as Loom's other programs
  EXPECT_NE(out.find("--hidden is for --model mlp, not --model gpt"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--model cnn --text x.txt");
  EXPECT_EQ(code, 2);  // a usage error, as Loom's other programs
  EXPECT_NE(out.find("--text is for --model gpt, not --model cnn"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--eval-every 5");
  EXPECT_EQ(code, 2);  // a usage error, as Loom's other programs
  EXPECT_NE(out.find("--eval-every is for --model gpt or --model cnn, not --model mlp"),
            std::string::npos)
      << out;
  std::tie(code, out) = runSingle("--model cnn --data-dir /nonexistent");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("/nonexistent/digits_train_x.npy is missing"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--model gpt --text /nonexistent.txt");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("cannot read '/nonexistent.txt'"), std::string::npos) << out;
  std::tie(code, out) = runSingle(std::string("--model gpt --text ") + LOOM_SOURCE_DIR +
                                  "/docs/ddp.md --width 30 --heads 4");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("--width 30 must be a multiple of --heads 4"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--amp fp8");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--amp: fp8 not in {none,bf16,fp16}"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--amp bf16 --amp-init-scale 1024");
  EXPECT_EQ(code, 2);  // a usage error, as Loom's other programs
  EXPECT_NE(out.find("--amp-init-scale is for --amp fp16"), std::string::npos) << out;
  std::tie(code, out) = runSingle("--amp fp16 --zero --steps 1");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("--amp fp16 does not work with --zero"), std::string::npos) << out;
  // PowerSGD's flags without the hook, and a negative checkpoint interval, were accepted and
  // did nothing.
  std::tie(code, out) = runSingle("--comm-hook fp16 --powersgd-rank 2");
  EXPECT_EQ(code, 2);  // a usage error, as Loom's other programs
  EXPECT_NE(out.find("--powersgd-rank is for --comm-hook powersgd"), std::string::npos) << out;
  // A numeric flag's value is checked when it is read, and named with what is expected.
  std::tie(code, out) = runSingle("--comm-hook powersgd --powersgd-rank 0");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("loom-train: --powersgd-rank: '0' is out of range; expected at least 1"),
            std::string::npos)
      << out;
  std::tie(code, out) = runSingle("--steps ten");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--steps: 'ten' is not a whole number; expected at least 0"),
            std::string::npos)
      << out;
  std::tie(code, out) = runSingle("--checkpoint-every -3");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--checkpoint-every"), std::string::npos) << out;
}

// --log on a full device: the failed writes are an error naming the log and errno (they were
// silent: the run exited 0 with no log).
TEST(LoomTrainLog, AFailedWriteIsAnErrorNamingTheLog) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  for (const char* more : {"", " --shrink-on-failure"}) {
    auto [code, out] = runSingle(std::string("--steps 3 --log /dev/full") + more);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("--log: cannot write /dev/full: No space left on device"), std::string::npos)
        << out;
  }
}

// --resume cuts the log's rows past the checkpoint's step by rewriting it through LOG.tmp; when
// that write fails (here a file size limit of one block), the log stays as it was, LOG.tmp is
// removed and the run fails naming it (the rename ran regardless and left a cut log).
TEST(LoomTrainLog, AFailedRewriteOnResumeLeavesTheLogAsItWas) {
  loom::testing::TempDir dir;
  const std::string log = dir.file("log.csv");
  auto [code, out] = runSingle("--steps 4 --checkpoint-dir " + dir.path() + " --log " + log);
  ASSERT_EQ(code, 0) << out;
  // Rows long enough that the four kept ones exceed the limit; rows 5-8 are past the checkpoint.
  std::string rows = "step,loss\n";
  for (int step = 1; step <= 8; ++step) {
    rows += std::to_string(step) + ",0.5" + std::string(400, '0') + "\n";
  }
  std::ofstream(log, std::ios::trunc) << rows;
  std::tie(code, out) =
      runSingle("--steps 8 --resume --checkpoint-dir " + dir.path() + " --log " + log,
                "trap '' XFSZ; ulimit -f 1; ");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("--log: cannot write " + log + ".tmp"), std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_EQ(readFile(log), rows);
  EXPECT_FALSE(std::filesystem::exists(log + ".tmp"));
}

// --keep-checkpoints copies the checkpoint beside the latest under its step, through a .tmp;
// when the rename fails (here the name is a non-empty directory) the run fails naming it and
// leaves no partial copy (the .tmp stayed, a checkpoint's size each time).
TEST(LoomTrainCheckpoints, AFailedKeepLeavesNoPartialCopy) {
  loom::testing::TempDir dir;
  const std::string kept = dir.file("checkpoint-2.safetensors");
  std::filesystem::create_directories(kept + "/occupied");
  auto [code, out] =
      runSingle("--steps 2 --checkpoint-every 2 --keep-checkpoints --checkpoint-dir " + dir.path());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("--keep-checkpoints: cannot keep " + kept), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(kept + ".tmp"));
}

}  // namespace
