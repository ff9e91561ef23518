// loom-train's command line: the flags (Args) and their parsing (parseArgs), apart from the
// training in main.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models.h"

namespace loom::train {

struct Args {
  int64_t in = 784;
  int64_t classes = 10;
  std::string hidden = "1024,1024";
  int64_t batch = 64;
  double lr = 0.01;
  double momentum = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;
  std::string optimizer = "sgd";
  int64_t steps = 100;
  uint64_t seed = 0;
  double bucketCapMb = 25;
  int accumulate = 1;
  std::string commHook = "none";
  int powerSgdRank = 1;
  int64_t powerSgdStart = 10;
  std::string lrSchedule = "none";
  bool staticGraph = false;
  bool copyGrads = false;
  bool plainBuckets = false;
  bool zero = false;
  // Reproducible reductions (docs/reproducible.md): the weights after N steps do not depend on
  // the algorithm, transport, bucket size, tuning or overlap.
  bool reproducible = false;
  std::string initWeights, data, labels, log, checkpointDir;
  bool noShuffle = false;
  bool resume = false;
  int64_t checkpointEvery = 0;
  int64_t samples = 8192;
  std::string model = "mlp";
  ModelArgs modelArgs;
  bool keepCheckpoints = false;
  // --amp (amp.h)
  std::string amp = "none";
  double ampInitScale = 65536.0;
  int64_t ampGrowthInterval = 2000;
  // --shrink-on-failure (shrink.h, docs/elastic.md)
  bool shrinkOnFailure = false;
  int minRanks = 1;
  double shrinkWindowS = 10;
  // Test only.
  std::vector<std::string> testKill;
  int64_t testStepDelayMs = 0;
};

// parseArgs's result when the flags are good and training should run; anything else is the
// exit status to return (0 after --help, kUsageError for a bad flag, the message on stderr).
constexpr int kParsed = -1;
constexpr int kUsageError = 2;  // as Loom's other programs

// Parses argv into `a` (Args' defaults for what is not given; gpt and cnn take their model's
// optimizer, learning rate and batch unless given) and checks the flags that depend on others.
int parseArgs(int argc, char** argv, Args& a);

}  // namespace loom::train
