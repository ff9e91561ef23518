// Reproducible mode across ranks (loom/comm/reproducible.h), checked bit for bit against the
// exact reference (reproducible_reference.h): thread ranks over a HashStore, shm, tcp and the
// two-host hierarchy, 2-5 ranks, forced algorithms, small and large chunks, permuted inputs,
// every reduce form (all-reduce, reduce, reduce-scatter even and uneven, in place).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/reduce.h"
#include "loom/comm/reproducible.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "reproducible_reference.h"

namespace loom::comm {
namespace {

using namespace repro_testing;  // the exact reference (reproducible_reference.h)
// ---- ranks ----

struct Config {
  bool shm;
  Algorithm algorithm;
  size_t chunkBytes;
  bool twoHosts = false;  // ranks split into two "hosts": the hierarchical engine
};

std::string describe(const Config& c, int n) {
  return std::string(c.shm ? (c.twoHosts ? "shm+tcp hierarchy" : "shm") : "tcp") +
         " algo=" + algorithmName(c.algorithm) + " chunk=" + std::to_string(c.chunkBytes) +
         " ranks=" + std::to_string(n);
}

// Runs body(rank, ctx) on n thread ranks with the mode on through ContextOptions.
void onRanks(int n, const Config& config, const std::function<void(int, Context&)>& body) {
  HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ContextOptions o;
        o.host = "127.0.0.1";
        o.sharedMemory = config.shm;
        o.algorithm = config.algorithm;
        o.chunkBytes = config.chunkBytes;
        o.timeout = std::chrono::seconds(60);
        o.reproducible = true;
        if (config.twoHosts) o.shmHostId = r < (n + 1) / 2 ? "host-a" : "host-b";
        auto ctx = Context::create(store, r, n, o);
        if (config.twoHosts && r == 0 && n >= 3) {  // rank 0's host holds two ranks or more
          EXPECT_NE(ctx->transportSummary().find("between"), std::string::npos)
              << ctx->transportSummary();
        }
        body(r, *ctx);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every reduce form on one world: the inputs row perm[r] on rank r, so a permutation of the ranks
// must not change a bit.
void checkWorld(int n, const Config& config, DType d, size_t count, uint64_t seed) {
  const Inputs in(d, n, count * n, seed);
  const auto sum = in.expected(false);
  const auto avg = in.expected(true);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::string what =
      describe(config, n) + " " + dtypeName(d) + " count=" + std::to_string(count);
  const size_t esize = dtypeSize(d);
  // Uneven blocks: rank j gets j elements more than count - something, summing to count * n.
  std::vector<size_t> uneven(n, count);
  if (n >= 2) {
    uneven[0] = count / 2;
    uneven[n - 1] = count + (count - count / 2);
  }
  onRanks(n, config, [&](int r, Context& ctx) {
    const auto& mine = in.data[perm[r]];
    const size_t total = count * n;
    std::vector<unsigned char> out(total * esize);
    CollectiveOptions opts;
    opts.seq = 1;
    allreduce(ctx, mine.data(), out.data(), total, d, ReduceOp::kSum, opts);
    EXPECT_EQ(mismatches(in, sum, out.data(), 0, total, what + " allreduce sum"), 0);
    std::vector<unsigned char> buf = mine;  // in place
    opts.seq = 2;
    allreduce(ctx, buf.data(), buf.data(), total, d, ReduceOp::kAvg, opts);
    EXPECT_EQ(mismatches(in, avg, buf.data(), 0, total, what + " allreduce avg in place"), 0);
    const int root = n - 1;
    opts.seq = 3;
    reduce(ctx, mine.data(), r == root ? out.data() : nullptr, total, d, ReduceOp::kSum, root,
           opts);
    if (r == root) {
      EXPECT_EQ(mismatches(in, sum, out.data(), 0, total, what + " reduce"), 0);
    }
    opts.seq = 4;
    reduceScatter(ctx, mine.data(), out.data(), count, d, ReduceOp::kAvg, opts);
    EXPECT_EQ(mismatches(in, avg, out.data(), r * count, count, what + " reduce_scatter avg"), 0);
    const size_t offset = std::accumulate(uneven.begin(), uneven.begin() + r, size_t{0});
    buf = mine;  // in place: out is this rank's block of in
    opts.seq = 5;
    reduceScatterv(ctx, buf.data(), buf.data() + offset * esize, uneven, d, ReduceOp::kSum, opts);
    EXPECT_EQ(mismatches(in, sum, buf.data() + offset * esize, offset, uneven[r],
                         what + " reduce_scatterv in place"),
              0);
  });
}

// One-pass sizes (a few elements) and windowed ones (more than kReproducibleOnePassBytes of
// accumulators), 2 to 5 ranks, shm, tcp and the two-host hierarchy, every all-reduce algorithm
// the tests can force.
TEST(ReproducibleRanks, EveryFormAlgorithmTransport) {
  const Config configs[] = {
      {true, Algorithm::kAuto, 512 << 10},
      {false, Algorithm::kAuto, 512 << 10},
      {false, Algorithm::kRing, 4096},
      {true, Algorithm::kRecursiveDoubling, 4096},
      {false, Algorithm::kHalvingDoubling, 4096},
      {true, Algorithm::kDirect, 512 << 10},
      {true, Algorithm::kAuto, 512 << 10, true},
  };
  uint64_t seed = 11;
  for (const Config& config : configs) {
    for (int n : {2, 3, 4, 5}) {
      const DType d = kDTypes[seed % 4];
      checkWorld(n, config, d, 3, ++seed);
      checkWorld(n, config, d, 700, ++seed);
    }
    // float32 over two ranks takes the narrow window: every form, 1,400 elements.
    checkWorld(2, config, DType::kFloat32, 700, 1000 + seed);
  }
}

TEST(ReproducibleRanks, Float64WindowedAndProdRefused) {
  const Config config{true, Algorithm::kAuto, 512 << 10};
  checkWorld(3, config, DType::kFloat64, 400, 99);
  onRanks(2, config, [](int, Context& ctx) {
    double x = 1;
    EXPECT_THROW(allreduce(ctx, &x, &x, 1, DType::kFloat64, ReduceOp::kProd), InvalidArgumentError);
    // Integers and max are exact already: they run as usual.
    int64_t i = 3;
    allreduce(ctx, &i, &i, 1, DType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(i, 6);
    allreduce(ctx, &x, &x, 1, DType::kFloat64, ReduceOp::kMax);
    EXPECT_EQ(x, 1.0);
  });
}

// All-reduce and reduce run large windowed buffers chunk by chunk (65,536 float32
// elements each): results across several chunks, refined elements in more than one of them,
// equal the unchunked arithmetic's bit for bit.
TEST(ReproducibleRanks, ChunkedWindowsMatchTheArithmetic) {
  for (const Config& config :
       {Config{true, Algorithm::kAuto, 512 << 10}, Config{false, Algorithm::kRing, 512 << 10}}) {
    const int n = config.shm ? 2 : 3;
    const size_t total = 140001;  // three chunks
    const Inputs in(DType::kFloat32, n, total, 5 + n);
    std::vector<const void*> ptrs;
    for (const auto& row : in.data) ptrs.push_back(row.data());
    std::vector<uint32_t> sum(total), avg(total);
    size_t refined = 0;
    reproducibleReduceLocal(ptrs, sum.data(), total, DType::kFloat32, ReduceOp::kSum,
                            ReproduciblePath::kWindowed, &refined);
    EXPECT_GT(refined, 2u);
    reproducibleReduceLocal(ptrs, avg.data(), total, DType::kFloat32, ReduceOp::kAvg,
                            ReproduciblePath::kWindowed);
    const std::string what = describe(config, n);
    onRanks(n, config, [&](int r, Context& ctx) {
      std::vector<uint32_t> out(total);
      CollectiveOptions opts;
      opts.seq = 1;
      allreduce(ctx, in.data[r].data(), out.data(), total, DType::kFloat32, ReduceOp::kSum, opts);
      EXPECT_TRUE(out == sum) << what << " allreduce sum";
      std::memcpy(out.data(), in.data[r].data(), total * 4);
      opts.seq = 2;
      allreduce(ctx, out.data(), out.data(), total, DType::kFloat32, ReduceOp::kAvg, opts);
      EXPECT_TRUE(out == avg) << what << " allreduce avg in place";
      std::fill(out.begin(), out.end(), 0u);
      opts.seq = 3;
      reduce(ctx, in.data[r].data(), r == 1 ? out.data() : nullptr, total, DType::kFloat32,
             ReduceOp::kSum, 1, opts);
      if (r == 1) {
        EXPECT_TRUE(out == sum) << what << " reduce";
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm
