// The killed-peer case shared by the process tests of plain and healing connections: three
// process ranks all-reduce until rank 2 SIGKILLs itself at sequence number 20; ranks 0 and 1
// must each get an IoError naming rank 2 within 5 s (checkDeadPeerError), and only rank 2 may
// have died (expectOnlyVictimKilled).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom::comm::testing {

inline void runKilledPeerCase(const ContextOptions& options) {
  using namespace std::chrono_literals;
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  const int victim = 2;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, options);
    CollectiveOptions opts;
    opts.timeout = 60s;
    std::vector<float> buf(4096, 1.0f);
    for (uint64_t seq = 1;; ++seq) {
      if (rank == victim && seq == 20) ::kill(::getpid(), SIGKILL);
      opts.seq = seq;
      const auto start = std::chrono::steady_clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kMax, opts);
      } catch (const IoError& e) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        loom::testing::checkDeadPeerError(e, waited, 5s, "rank 2");
        return;
      }
      LOOM_CHECK(seq < 1000000, "never saw the failure");
    }
  });
  loom::testing::expectOnlyVictimKilled(children.waitAll(60s), victim);
}

}  // namespace loom::comm::testing
