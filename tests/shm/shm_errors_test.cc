// Error paths of the shared-memory collectives with thread ranks: a collective mismatch is
// an InvalidArgumentError on every rank naming what differed (the transport is aborted); a rank
// that never arrives is a TimeoutError naming it and the collective, after which the whole group
// fails fast; Context::abort from another thread ends a blocked collective;
// ContextOptions::sharedMemory=false on all ranks or on any one rank falls back to tcp on every
// rank.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "shm/shm.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ContextOptions options() {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 30s;
  return o;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(ShmErrors, MismatchedCountsAreAnInvalidArgumentErrorOnEveryRank) {
  HashStore store;
  std::vector<std::string> errors(2);
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    ASSERT_NE(shm::arenaOf(*ctx), nullptr);
    std::vector<float> buf(16, 1.0f);
    CollectiveOptions opts;
    opts.seq = 7;
    opts.timeout = 20s;
    try {
      allreduce(*ctx, buf.data(), buf.data(), rank == 0 ? 10 : 11, DType::kFloat32, ReduceOp::kSum,
                opts);
    } catch (const InvalidArgumentError& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains(errors[rank], "allreduce#7")) << errors[rank];
  }
  EXPECT_TRUE(contains(errors[0] + errors[1], "different arguments")) << errors[0] << errors[1];
}

TEST(ShmErrors, MissingRankTimesOutNamingItThenTheGroupFailsFast) {
  HashStore store;
  std::string timeoutMessage, laterMessage;
  bool wasTimeout = false;
  std::atomic<bool> rank0Done{false};
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    std::vector<int32_t> buf(100, 1);
    CollectiveOptions opts;
    opts.seq = 3;
    opts.timeout = 300ms;
    if (rank == 0) {
      const auto start = Clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum, opts);
      } catch (const IoError& e) {
        timeoutMessage = e.what();
        wasTimeout = dynamic_cast<const TimeoutError*>(&e) != nullptr;
      }
      EXPECT_LT(Clock::now() - start, 5s);
      rank0Done = true;
    } else {
      const Deadline deadline(20s);
      while (!rank0Done && !deadline.expired()) std::this_thread::yield();
      opts.timeout = 20s;
      const auto start = Clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum, opts);
      } catch (const IoError& e) {
        laterMessage = e.what();
      }
      EXPECT_LT(Clock::now() - start, 5s);
    }
  });
  EXPECT_TRUE(wasTimeout) << timeoutMessage;
  EXPECT_TRUE(contains(timeoutMessage, "allreduce#3")) << timeoutMessage;
  EXPECT_TRUE(contains(timeoutMessage, "rank 1")) << timeoutMessage;
  EXPECT_TRUE(contains(laterMessage, "failed")) << laterMessage;
}

TEST(ShmErrors, AbortFromAnotherThreadEndsABlockedCollective) {
  HashStore store;
  std::string message;
  std::atomic<bool> rank0Done{false};
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    if (rank == 1) {
      // Rank 1 never joins; it waits for rank 0 to finish so that its Context outlives the
      // collective (a destroyed context is a different error).
      const Deadline deadline(20s);
      while (!rank0Done && !deadline.expired()) std::this_thread::yield();
      return;
    }
    std::thread aborter([&] { ctx->abort("test abort"); });
    std::vector<double> buf(1 << 16, 1.0);
    CollectiveOptions opts;
    opts.timeout = 60s;
    const auto start = Clock::now();
    try {
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat64, ReduceOp::kSum, opts);
    } catch (const IoError& e) {
      message = e.what();
    }
    aborter.join();
    EXPECT_LT(Clock::now() - start, 5s);
    rank0Done = true;
  });
  EXPECT_TRUE(contains(message, "test abort")) << message;
}

void expectTcpFallback(const std::function<ContextOptions(int)>& optionsFor) {
  HashStore store;
  loom::testing::runThreadRanks(3, [&](int rank) {
    auto ctx = Context::create(store, rank, 3, optionsFor(rank));
    LOOM_CHECK(shm::arenaOf(*ctx) == nullptr, "rank ", rank, " got an arena");
    std::vector<int64_t> buf(1000, rank + 1);
    allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kInt64, ReduceOp::kSum);
    for (int64_t v : buf) LOOM_CHECK_EQ(v, 6);
  });
}

TEST(ShmErrors, SwitchedOffFallsBackToTcp) {
  expectTcpFallback([](int) {
    ContextOptions o = options();
    o.sharedMemory = false;
    return o;
  });
}

TEST(ShmErrors, OneRankWithSharedMemoryOffTurnsItOffForAll) {
  expectTcpFallback([](int rank) {
    ContextOptions o = options();
    o.sharedMemory = rank != 2;
    return o;
  });
}

TEST(ShmErrors, ForcedAlgorithmRunsOverTcpNextToTheArena) {
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    ASSERT_NE(shm::arenaOf(*ctx), nullptr);
    std::vector<float> buf(5000, 1.0f);
    CollectiveOptions opts;
    for (Algorithm a :
         {Algorithm::kRing, Algorithm::kAuto, Algorithm::kRecursiveDoubling, Algorithm::kAuto}) {
      opts.algorithm = a;
      ++opts.seq;
      std::fill(buf.begin(), buf.end(), 1.0f);
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum, opts);
      for (float v : buf) LOOM_CHECK_EQ(v, 2.0f);
    }
  });
}

// A single-copy read that fails mid-operation (the root's buffer cannot be read) is an IoError
// on every rank naming the peer and the errno text, never a wrong result.
TEST(ShmErrors, FailedSingleCopyReadIsAnIoErrorOnEveryRank) {
  HashStore store;
  const size_t bytes = size_t{4} << 20;
  // An address range nobody may read: the root "passes" it; it never touches it itself.
  void* hole = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  std::vector<std::string> errors(2);
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o = options();
    o.shmSingleCopy = ShmSingleCopy::kOn;
    auto ctx = Context::create(store, rank, 2, o);
    ASSERT_NE(shm::arenaOf(*ctx), nullptr);
    std::vector<uint8_t> mine(bytes, 7);
    CollectiveOptions opts;
    opts.seq = 3;
    opts.timeout = 20s;
    try {
      broadcast(*ctx, rank == 0 ? hole : mine.data(), bytes, DType::kUInt8, 0, opts);
    } catch (const IoError& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_TRUE(contains(errors[1], "broadcast#3")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "process_vm_readv failed: Bad address")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "rank 0")) << errors[1];
  EXPECT_TRUE(contains(errors[0], "broadcast#3")) << errors[0];
  ::munmap(hole, bytes);
}

}  // namespace
}  // namespace loom::comm::testing
