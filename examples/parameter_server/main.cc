// loom-ps-example: trains the parameter-server model with 1 server and N trainer processes
// (loom::spawn), prints the loss of every round, and with --check compares the final
// parameters with the same training done in this one process.
//
//   build/bin/loom-ps-example --trainers 3 --rounds 30 --check
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "loom/cli/checks.h"
#include "loom/common/settings.h"
#include "parameter_server.h"

int main(int argc, char** argv) {
  loom::examples::PsConfig c;
  bool check = false;
  CLI::App app{"Parameter server over Loom RPC: 1 server, N trainers, synchronous rounds"};
  app.add_option("--trainers", c.trainers, "trainer processes")->check(loom::cli::wholeIn(1, 64));
  app.add_option("--rounds", c.rounds, "synchronous rounds")->check(loom::cli::wholeIn(1, 100000));
  app.add_option("--batch", c.perTrainerBatch, "samples per trainer per round")
      ->check(loom::cli::wholeIn(1, 1 << 20));
  app.add_option("--vocab", c.vocab, "embedding rows")->check(loom::cli::wholeIn(1, 1 << 24));
  app.add_option("--dim", c.dim, "embedding width")->check(loom::cli::wholeIn(1, 4096));
  app.add_option("--lr", c.lr, "SGD learning rate");
  app.add_option("--seed", c.seed, "data and initial weights");
  app.add_flag("--check", check, "compare with the same training in one process");
  CLI11_PARSE(app, argc, argv);

  std::string scratch = loom::settings::text("TMPDIR").value_or("/tmp") + "/loom-ps-XXXXXX";
  if (::mkdtemp(scratch.data()) == nullptr) {
    std::cerr << "loom-ps-example: cannot make a directory " << scratch << "\n";
    return 1;
  }
  int code = 0;
  try {
    const auto result = loom::examples::trainDistributed(c, scratch);
    for (size_t r = 0; r < result.losses.size(); ++r) {
      std::printf("round %3zu  loss %.6f\n", r, result.losses[r]);
    }
    if (check) {
      const auto ref = loom::examples::trainOneProcess(c);
      double maxDiff = 0;
      auto cmp = [&](const std::vector<float>& a, const std::vector<float>& b) {
        for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
          maxDiff = std::max(maxDiff, static_cast<double>(std::fabs(a[i] - b[i])));
        }
      };
      cmp(result.params.embedding, ref.params.embedding);
      cmp(result.params.weight, ref.params.weight);
      cmp(result.params.bias, ref.params.bias);
      std::printf("max |distributed - one process| over all parameters: %.3g\n", maxDiff);
      if (maxDiff > 1e-6) code = 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "loom-ps-example: " << e.what() << "\n";
    code = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  return code;
}
