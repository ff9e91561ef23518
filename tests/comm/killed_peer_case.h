// The killed-peer case shared by the process tests of tcp, healing connections and shared
// memory: `size` process ranks all-reduce until rank 2 SIGKILLs itself at sequence number
// `killAt`; every other rank must get an IoError naming rank 2 within 5 s
// (checkDeadPeerError), and only rank 2 may have died (expectOnlyVictimKilled).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom::comm::testing {

struct KilledPeerCase {
  int size = 3;
  uint64_t killAt = 20;
  // Elements of the all-reduce at each sequence number.
  std::function<size_t(uint64_t seq)> count = [](uint64_t) { return size_t{4096}; };
  // Run in every rank once its Context exists (e.g. to check which path it has).
  std::function<void(Context&)> check = [](Context&) {};
};

inline void runKilledPeerCase(const ContextOptions& options, const KilledPeerCase& c = {}) {
  using namespace std::chrono_literals;
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int victim = 2;
  children.spawnRanks(c.size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, c.size, options);
    c.check(*ctx);
    CollectiveOptions opts;
    opts.timeout = 60s;
    std::vector<float> buf;
    for (uint64_t seq = 1;; ++seq) {
      if (rank == victim && seq == c.killAt) ::kill(::getpid(), SIGKILL);
      opts.seq = seq;
      const auto start = std::chrono::steady_clock::now();
      try {
        buf.assign(c.count(seq), 1.0f);
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
