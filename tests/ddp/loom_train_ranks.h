// Runs loom-train (LOOM_TRAIN_BIN, a compile definition of the test target) on `world` process
// ranks with the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT),
// as torchrun or loom-run would start them. Shared by the loom_train*_test binaries; each forks
// its ranks (loom::testing::ChildProcesses), so call it before any thread exists in the test.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/common/socket.h"
#include "loom/testing/ranks.h"

#ifndef LOOM_TRAIN_BIN
#error "loom_train_ranks.h needs LOOM_TRAIN_BIN, the path of loom-train (a compile definition)"
#endif

namespace loom::testing {

struct LoomTrainRanks {
  int world = 2;
  int port = 0;  // MASTER_PORT: rank 0's store; one per run (freePort())
  // Set in every rank before the launcher's variables (which win over a name repeated here).
  std::vector<std::pair<std::string, std::string>> env;
  // The file rank r's stdout is written to (created or truncated, "/dev/null" to drop it);
  // unset or "" keeps the test's stdout.
  std::function<std::string(int rank)> stdoutPath;
  std::chrono::milliseconds deadline{60000};  // for all ranks; a rank still running is killed
};

// A port nothing on this machine listens on now, for a run's MASTER_PORT: the kernel's pick for a
// socket bound to port 0, closed before rank 0 binds it (as torch's tests' find_free_port). The
// fixed per-binary ranges used before overlapped between the loom_train*_test binaries, which
// ctest runs at once, so two runs could take one port.
inline int freePort() {
  net::Socket s = net::listenOn("0.0.0.0", 0);
  return net::localPort(s.fd());
}

// Runs `args` (loom-train's flags) on the ranks of `run`; returns "" when every rank exited 0,
// else a description of each failure (exit 126: stdout could not be redirected, 127: no exec).
inline std::string runLoomTrainRanks(const std::vector<std::string>& args,
                                     const LoomTrainRanks& run) {
  ChildProcesses ranks;
  for (int r = 0; r < run.world; ++r) {
    ranks.spawn([&, r] {
      for (const auto& [name, value] : run.env) ::setenv(name.c_str(), value.c_str(), 1);
      const std::string out = run.stdoutPath ? run.stdoutPath(r) : "";
      if (!out.empty()) {
        const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0) ::_exit(126);
        ::close(fd);
      }
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(run.world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(run.port).c_str(), 1);
      std::vector<std::string> all{LOOM_TRAIN_BIN};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    });
  }
  return ranks.waitAllOk(run.deadline);
}

// The losses of loom-train's --log file ("step,loss", then one row per step from 1),
// checking the header and the step numbers as it reads.
inline std::vector<double> readLosses(const std::string& path) {
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

}  // namespace loom::testing
