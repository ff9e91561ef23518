// LaunchOptions: everything loom-run's command line says, parsed and checked.
//
// parseLaunchOptions() never exits the process: it returns the options, or a ParseOutcome
// telling main() to print help (exit 0) or a usage error (exit 2). Every bad value gets a
// message naming the flag, the value and what was expected.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace loom::run {

struct LaunchOptions {
  int nprocPerNode = 1;
  int nnodes = 1;
  int nodeRank = 0;
  // --nnodes MIN:MAX: an elastic job (docs/launcher.md, elastic_rendezvous.h). nnodes is then
  // MAX; nodes get their rank in each round.
  bool elastic = false;
  int minNodes = 1;
  int maxNodes = 1;
  std::chrono::milliseconds lastCall{2000};
  std::string masterAddr = "127.0.0.1";
  bool masterAddrGiven = false;
  int masterPort = 0;  // 0: pick a free port (single node only)
  int maxRestarts = 0;
  // --on-worker-failure: kStop (the default, torchrun's) stops every worker when one fails;
  // kContinue leaves the others running (a trainer that shrinks in place, loom-train
  // --shrink-on-failure). Single node only.
  enum class OnWorkerFailure { kStop, kContinue };
  OnWorkerFailure onWorkerFailure = OnWorkerFailure::kStop;
  bool redirectPrefix = false;
  std::chrono::milliseconds gracePeriod{5000};
  std::chrono::milliseconds rdzvTimeout{60000};
  std::chrono::milliseconds nodeTimeout{30000};
  std::string runId = "default";
  // Where nodes other than 0 reach the rendezvous store; empty: masterAddr:masterPort.
  std::string rdzvHost;
  int rdzvPort = 0;
  std::vector<std::string> command;  // PROGRAM ARGS...
};

struct ParseOutcome {
  enum Kind { kRun, kHelp, kUsageError };
  Kind kind = kRun;
  LaunchOptions options;
  std::string text;  // help text, or the error followed by the usage line
  // kRun: flags that were given but do nothing in this kind of run (torchrun scripts pass
  // rendezvous flags to single-node jobs); main() prints each as a note.
  std::vector<std::string> unused;
};

ParseOutcome parseLaunchOptions(int argc, const char* const* argv);

}  // namespace loom::run
