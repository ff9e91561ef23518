// The staged all-reduce's helper threads (ContextOptions::shmCopyThreads, comm/src/shm/
// copy_helpers.h), with thread ranks:
// - with 2 helpers per rank (or helpers on one rank only) every rank's result is bit for bit
//   the one-thread result, for float/double/half/bfloat16 sum and avg and int32 max/sum, at 2,
//   3 and 4 ranks, in place and out of place, at sizes just below and at the helpers'
//   threshold (256 KiB per step), over several chunks with a partial last one, and above
//   8 MiB (whole-slot steps, streamed copy-out); float sums also equal the rank-order fold
//   computed here;
// - Context::abort while the helpers are in a part ends Arena::parallel with the group's
//   IoError once every part stopped; a part that never ends is a TimeoutError at the call's
//   deadline; an abort during a loop of large all-reduces ends every rank with an IoError in
//   bounded time;
// - LOOM_SHM_COPY_THREADS parses (0, N, auto; out of range refused) and "auto" resolves to
//   floor(cpus / local ranks) - 1.
// 2.5-5 s on the 2-core VM (quiet to loaded), 1.7 s of CPU.
#include <gtest/gtest.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "context_settings.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/reduce.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "loom/testing/scoped_env.h"
#include "shm/arena.h"
#include "shm/shm.h"
#include "signature.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ContextOptions options(int copyThreads) {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 30s;
  o.shmSingleCopy = ShmSingleCopy::kOff;  // the staged path at every size
  o.shmCopyThreads = copyThreads;
  return o;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// Floats whose sums depend on the order of the additions.
float awkwardValue(std::mt19937& gen, int maxExponent) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-maxExponent, maxExponent);
  return std::ldexp(mant(gen), expo(gen)) * (gen() % 2 ? 1.0f : -1.0f);
}

// Inputs: values drawn from a table of awkward values (cheap for 8 MiB buffers).
std::vector<uint8_t> input(DType dtype, size_t count, uint32_t seed) {
  static const std::vector<float> table = [] {
    std::mt19937 gen(12345);
    std::vector<float> t(4096);
    for (float& x : t) x = awkwardValue(gen, 20);
    return t;
  }();
  std::mt19937 gen(seed);
  const size_t es = dtypeSize(dtype);
  std::vector<uint8_t> v(count * es);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = gen();
    const float x = table[r & 4095];
    uint8_t* p = v.data() + i * es;
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(p, &x, 4);
        break;
      case DType::kFloat64: {
        const double d = static_cast<double>(x) * (1.0 + 1e-9 * static_cast<double>(r >> 28));
        std::memcpy(p, &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = floatToHalf(std::ldexp(x, -14));  // |x| < 2^7: finite sums
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = floatToBFloat16(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kInt32: {
        const int32_t k = static_cast<int32_t>(r >> 12) % 2001 - 1000;
        std::memcpy(p, &k, 4);
        break;
      }
      default:
        LOOM_CHECK(false, "no input for this dtype");
    }
  }
  return v;
}

struct Case {
  DType dtype;
  ReduceOp op;
  size_t bytes;  // per rank, rounded down to whole elements
};

std::vector<Case> cases(int size) {
  constexpr size_t kStep = shm::Arena::kHelperMinStepBytes;
  std::vector<Case> all;
  const std::pair<DType, ReduceOp> kinds[] = {
      {DType::kFloat32, ReduceOp::kSum},  {DType::kFloat32, ReduceOp::kAvg},
      {DType::kFloat64, ReduceOp::kSum},  {DType::kFloat16, ReduceOp::kSum},
      {DType::kBFloat16, ReduceOp::kAvg}, {DType::kInt32, ReduceOp::kMax},
      {DType::kInt32, ReduceOp::kSum}};
  for (const auto& [dtype, op] : kinds) {
    // Just below the threshold (one thread), at it (one helped step), and several steps whose
    // last one is partial and below it (odd sizes: uneven segments, unaligned parts).
    for (size_t bytes : {kStep - 64, kStep, 3 * kStep + 4 * 1000 + 36}) {
      all.push_back({dtype, op, bytes});
    }
  }
  // Above 8 MiB: whole-slot steps and a streamed copy-out (at 4 ranks only: 1 s on 2 cores).
  if (size == 4) all.push_back({DType::kFloat32, ReduceOp::kSum, (size_t{8} << 20) + 4 * 333});
  return all;
}

// Every rank's output of every case, in place then out of place, over `size` thread ranks with
// copyThreads(rank) helpers each.
std::vector<std::vector<std::vector<uint8_t>>> runCases(int size,
                                                        const std::function<int(int)>& threads) {
  HashStore store;
  const std::vector<Case> all = cases(size);
  std::vector<std::vector<std::vector<uint8_t>>> results(size);
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, options(threads(rank)));
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena between thread ranks");
    LOOM_CHECK_EQ(arena->copyThreads(), threads(rank));
    CollectiveOptions opts;
    for (const Case& c : all) {
      const size_t es = dtypeSize(c.dtype);
      const size_t count = c.bytes / es;
      const auto in = input(c.dtype, count, 1000 + rank * 7 + static_cast<uint32_t>(c.bytes));
      std::vector<uint8_t> buf = in;
      ++opts.seq;
      allreduce(*ctx, buf.data(), buf.data(), count, c.dtype, c.op, opts);
      results[rank].push_back(buf);
      std::vector<uint8_t> out(in.size(), 0xee);
      ++opts.seq;
      allreduce(*ctx, in.data(), out.data(), count, c.dtype, c.op, opts);
      results[rank].push_back(out);
    }
    // The helpers really ran (they start on the first step that uses them).
    LOOM_CHECK_EQ(arena->helperThreadsRunning(), threads(rank));
  });
  return results;
}

void expectSameBits(const std::vector<std::vector<std::vector<uint8_t>>>& want,
                    const std::vector<std::vector<std::vector<uint8_t>>>& got, const char* what,
                    int size) {
  const std::vector<Case> all = cases(size);
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(got[r].size(), want[r].size());
    for (size_t i = 0; i < want[r].size(); ++i) {
      const Case& c = all[i / 2];
      ASSERT_EQ(got[r][i].size(), want[r][i].size());
      const bool same = std::memcmp(got[r][i].data(), want[r][i].data(), want[r][i].size()) == 0;
      EXPECT_TRUE(same) << what << ", " << size << " ranks, rank " << r << ": "
                        << dtypeName(c.dtype) << " " << reduceOpName(c.op) << ", " << c.bytes
                        << " bytes, " << (i % 2 == 0 ? "in place" : "out of place");
    }
  }
}

TEST(ShmCopyHelpers, GiveTheOneThreadBits) {
  for (int size : {2, 3, 4}) {
    const std::vector<Case> all = cases(size);
    const auto plain = runCases(size, [](int) { return 0; });
    // The float sums against the rank-order fold computed here, so that "the same bits" is
    // not two wrong answers agreeing.
    for (size_t i = 0; i < all.size(); ++i) {
      const Case& c = all[i];
      if (c.dtype != DType::kFloat32 || c.op != ReduceOp::kSum) continue;
      const size_t count = c.bytes / 4;
      std::vector<std::vector<uint8_t>> in;
      for (int q = 0; q < size; ++q) {
        in.push_back(input(c.dtype, count, 1000 + q * 7 + static_cast<uint32_t>(c.bytes)));
      }
      for (size_t e = 0; e < count; e += 97) {
        float x[2];
        std::memcpy(&x[0], in[0].data() + e * 4, 4);
        std::memcpy(&x[1], in[1].data() + e * 4, 4);
        float sum = x[0] + x[1];
        for (int q = 2; q < size; ++q) {
          std::memcpy(&x[0], in[q].data() + e * 4, 4);
          sum += x[0];
        }
        for (int r = 0; r < size; ++r) {
          ASSERT_EQ(std::memcmp(plain[r][2 * i].data() + e * 4, &sum, 4), 0)
              << size << " ranks, rank " << r << ", " << c.bytes << " bytes, element " << e;
        }
      }
    }
    expectSameBits(plain, runCases(size, [](int) { return 2; }), "2 helpers per rank", size);
    // Ranks with and without helpers in one group (the setting need not be equal).
    if (size == 3) {
      expectSameBits(plain, runCases(size, [](int rank) { return rank == 0 ? 1 : 0; }),
                     "1 helper on rank 0 only", size);
    }
  }
}

// Runs `body(ctx, arena)` on rank 0 of 2 thread ranks with 2 helpers each; rank 1 keeps its
// Context until rank 0 is done (a destroyed context is another error).
void onRankZero(const std::function<void(Context&, shm::Arena&)>& body) {
  HashStore store;
  std::atomic<bool> done{false};
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options(2));
    if (rank == 1) {
      const Deadline deadline(30s);
      while (!done && !deadline.expired()) std::this_thread::sleep_for(1ms);
      return;
    }
    try {
      body(*ctx, *shm::arenaOf(*ctx));
    } catch (...) {
      done = true;
      throw;
    }
    done = true;
  });
}

shm::Arena::Call testCall(std::chrono::milliseconds timeout) {
  return shm::Arena::Call{0, timeout, 1 << 20, Signature{}, 0, 7};
}

// Parts that run until told to stop (or 20 s, a test failure): what the helpers do mid-copy.
struct EndlessParts {
  shm::Arena& arena;
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  bool operator()(int, int) {
    ++started;
    const Deadline deadline(20s);
    while (!arena.partsStopped()) {
      if (deadline.expired()) return true;
      std::this_thread::yield();
    }
    ++stopped;
    return false;
  }
};

TEST(ShmCopyHelpers, AbortStopsThePartsAndIsTheGroupsError) {
  onRankZero([](Context& ctx, shm::Arena& arena) {
    EndlessParts parts{arena};
    std::thread aborter([&] {
      const Deadline deadline(20s);
      while (parts.started < 3 && !deadline.expired()) std::this_thread::sleep_for(1ms);
      ctx.abort("test abort");
    });
    const auto start = Clock::now();
    std::string message;
    try {
      arena.parallel(testCall(60s), 3, parts);
    } catch (const IoError& e) {
      message = e.what();
    }
    aborter.join();
    EXPECT_TRUE(contains(message, "test abort")) << message;
    EXPECT_EQ(parts.started.load(), 3);  // the caller and both helpers were in a part
    EXPECT_EQ(parts.stopped.load(), 3);  // and every one stopped before parallel returned
    EXPECT_LT(Clock::now() - start, 10s);
  });
}

TEST(ShmCopyHelpers, PartsThatDoNotEndAreATimeoutAtTheCallsDeadline) {
  onRankZero([](Context&, shm::Arena& arena) {
    EndlessParts parts{arena};
    // Part 0 (this thread) returns at once; the helpers' parts run until stopped.
    auto body = [&](int part, int n) { return part == 0 ? true : parts(part, n); };
    const auto start = Clock::now();
    std::string message;
    try {
      arena.parallel(testCall(300ms), 3, body);
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto waited = Clock::now() - start;
    EXPECT_TRUE(contains(message, "helper threads")) << message;
    EXPECT_EQ(parts.stopped.load(), 2);
    EXPECT_GE(waited, 250ms);
    EXPECT_LT(waited, 10s);
  });
}

TEST(ShmCopyHelpers, AbortDuringLargeAllreducesEndsEveryRank) {
  HashStore store;
  const int size = 3;
  std::vector<std::string> messages(size);
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, options(2));
    std::vector<float> buf(1 << 20, 1.0f);  // 4 MiB: 16 helped steps per call
    std::thread aborter;
    CollectiveOptions opts;
    opts.timeout = 60s;
    Clock::time_point abortAt{};
    for (uint64_t seq = 1; seq < 100000; ++seq) {
      if (rank == 0 && seq == 4) {
        aborter = std::thread([&] {
          std::this_thread::sleep_for(2ms);  // into the next call: most of it is copying
          abortAt = Clock::now();
          ctx->abort("test abort");
        });
      }
      opts.seq = seq;
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kMax, opts);
      } catch (const IoError& e) {
        messages[rank] = e.what();
        break;
      }
    }
    if (aborter.joinable()) aborter.join();
    if (rank == 0) {
      EXPECT_LT(Clock::now() - abortAt, 10s);
    }
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(contains(messages[r], "test abort")) << "rank " << r << ": " << messages[r];
  }
}

TEST(ShmCopyHelpers, SettingAndAuto) {
  EXPECT_EQ(shm::copyThreadsFor(0, 16, 8), 0);
  EXPECT_EQ(shm::copyThreadsFor(3, 2, 2), 3);  // forced: whatever the cores
  EXPECT_EQ(shm::copyThreadsFor(1000, 2, 2), 64);
  EXPECT_EQ(shm::copyThreadsFor(-1, 16, 8), 1);
  EXPECT_EQ(shm::copyThreadsFor(-1, 16, 4), 3);
  EXPECT_EQ(shm::copyThreadsFor(-1, 16, 16), 0);
  EXPECT_EQ(shm::copyThreadsFor(-1, 2, 2), 0);
  EXPECT_EQ(shm::copyThreadsFor(-1, 17, 8), 1);
  {
    loom::testing::ScopedEnv env("LOOM_SHM_COPY_THREADS", "auto");
    EXPECT_EQ(withEnvironment(ContextOptions{}).shmCopyThreads, -1);
  }
  {
    loom::testing::ScopedEnv env("LOOM_SHM_COPY_THREADS", "3");
    EXPECT_EQ(withEnvironment(ContextOptions{}).shmCopyThreads, 3);
  }
  for (const char* bad : {"65", "-1", "many"}) {
    loom::testing::ScopedEnv env("LOOM_SHM_COPY_THREADS", bad);
    EXPECT_THROW(withEnvironment(ContextOptions{}), InvalidArgumentError) << bad;
  }
  {
    loom::testing::ScopedEnv env("LOOM_SHM_COPY_THREADS", nullptr);
    EXPECT_EQ(withEnvironment(ContextOptions{}).shmCopyThreads, 0);
  }
  ContextOptions bad;
  bad.shmCopyThreads = -2;
  EXPECT_THROW(validateOptions(bad), InvalidArgumentError);
}

}  // namespace
}  // namespace loom::comm::testing
