// Reproducible mode across ranks (loom/comm/reproducible.h), checked bit for bit against the
// exact reference (reproducible_reference.h): thread ranks over a HashStore, shm, tcp and the
// two-host hierarchy, 2-5 ranks, forced algorithms, small and large chunks, permuted inputs,
// every reduce form (all-reduce, reduce, reduce-scatter even and uneven, in place).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
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
#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "reproducible_reference.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace loom::comm {
namespace {

using namespace repro_testing;  // the exact reference (reproducible_reference.h)
// ---- ranks ----

struct Config {
  bool shm;
  Algorithm algorithm;
  size_t chunkBytes;
  bool twoHosts = false;      // ranks split into two "hosts": the hierarchical engine
  size_t windowMinBytes = 0;  // ContextOptions::shmWindowMinBytes (0: the built-in sizes)
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
        o.shmWindowMinBytes = config.windowMinBytes;
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

// Runs body(rank, ctx) on n thread ranks, each Context made with `options(rank, o)` applied to
// loopback defaults, and returns each rank's error message (empty where the body returned).
std::vector<std::string> errorsOnRanks(int n,
                                       const std::function<void(int, ContextOptions&)>& options,
                                       const std::function<void(int, Context&)>& body) {
  HashStore store;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ContextOptions o;
        o.host = "127.0.0.1";
        o.timeout = std::chrono::seconds(30);
        options(r, o);
        auto ctx = Context::create(store, r, n, o);
        body(r, *ctx);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
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
    buf = mine;  // in place, even blocks: out is this rank's block of in
    opts.seq = 6;
    reduceScatter(ctx, buf.data(), buf.data() + r * count * esize, count, d, ReduceOp::kSum, opts);
    EXPECT_EQ(mismatches(in, sum, buf.data() + r * count * esize, r * count, count,
                         what + " reduce_scatter sum in place"),
              0);
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
    // Two ranks take the pair path (raw values, one IEEE operation per element): float32,
    // every form, 1,400 elements.
    checkWorld(2, config, DType::kFloat32, 700, 1000 + seed);
  }
}

// Buffers in Loom Windows (DDP's buckets) over shm: the exact all-reduce takes the window
// path's one pass (shm::windowAllreduceRows), from 1 byte (windowMinBytes 1) to several bounce
// buffers per segment, out of place and in place, with the 2-rank pair path (AVG of float16)
// too; the exact reduce-scatter reads every rank's input in place (shm::windowReduceScatterRows)
// out of place and in place; the exact reduce writes each rank's segment into the root's window
// (shm::windowReduceRows), in place, or the root reduces alone into ordinary memory. Bit for bit
// against the
// exact reference with permuted ranks; and a rank whose buffer is not in a Window fails every
// rank naming both paths, for all three collectives, which a mode that staged window buffers
// would not.
TEST(ReproducibleRanks, WindowBuffersTakeTheZeroCopyPath) {
  const Config config{true, Algorithm::kAuto, 512 << 10, false, 1};
  uint64_t seed = 77;
  for (int n : {2, 3, 4}) {
    for (size_t count : {size_t{3}, size_t{700}, size_t{300001}}) {
      const DType d = n == 2 ? DType::kFloat16 : kDTypes[seed % 4];
      const Inputs in(d, n, count, ++seed);
      const auto sum = in.expected(false);
      const auto avg = in.expected(true);
      std::vector<int> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      std::rotate(perm.begin(), perm.begin() + 1, perm.end());
      const std::string what = std::string("windows ") + dtypeName(d) +
                               " ranks=" + std::to_string(n) + " count=" + std::to_string(count);
      const size_t bytes = count * dtypeSize(d);
      onRanks(n, config, [&](int r, Context& ctx) {
        auto win = Window::allocate(2 * bytes);
        auto* buf = static_cast<unsigned char*>(win->data());
        std::memcpy(buf, in.data[perm[r]].data(), bytes);
        CollectiveOptions opts;
        opts.seq = 1;
        allreduce(ctx, buf, buf + bytes, count, d, ReduceOp::kSum, opts);
        EXPECT_EQ(mismatches(in, sum, buf + bytes, 0, count, what + " sum"), 0);
        opts.seq = 2;
        allreduce(ctx, buf, buf, count, d, ReduceOp::kAvg, opts);
        EXPECT_EQ(mismatches(in, avg, buf, 0, count, what + " avg in place"), 0);
        // The exact reduce to a root that moves with the count: in place (SUM), every rank
        // writing its segment into the root's window while the others' inputs stay as they
        // were; then AVG into a root output outside any window (the root reduces alone).
        const int root = static_cast<int>(count % static_cast<size_t>(n));
        std::memcpy(buf, in.data[perm[r]].data(), bytes);
        opts.seq = 3;
        reduce(ctx, buf, buf, count, d, ReduceOp::kSum, root, opts);
        if (r == root) {
          EXPECT_EQ(mismatches(in, sum, buf, 0, count, what + " reduce sum in place"), 0);
        } else {
          EXPECT_EQ(std::memcmp(buf, in.data[perm[r]].data(), bytes), 0)
              << what << ": rank " << r << "'s input changed";
        }
        std::memcpy(buf + bytes, in.data[perm[r]].data(), bytes);
        std::vector<unsigned char> plain(r == root ? bytes : 0);
        opts.seq = 4;
        reduce(ctx, buf + bytes, r == root ? plain.data() : nullptr, count, d, ReduceOp::kAvg, root,
               opts);
        if (r == root) {
          EXPECT_EQ(mismatches(in, avg, plain.data(), 0, count, what + " reduce avg"), 0);
        }
      });
      // Reduce-scatter of n blocks of `block` elements: out of place (AVG) and in place (out is
      // this rank's block of the input, SUM); shifted one element against it is refused.
      const size_t block = count / n;
      if (block == 0) continue;
      const Inputs rs(d, n, block * n, ++seed);
      const auto rsSum = rs.expected(false);
      const auto rsAvg = rs.expected(true);
      const size_t es = dtypeSize(d);
      onRanks(n, config, [&](int r, Context& ctx) {
        auto win = Window::allocate(block * n * es);
        auto* buf = static_cast<unsigned char*>(win->data());
        const auto load = [&] { std::memcpy(buf, rs.data[perm[r]].data(), block * n * es); };
        const size_t mine = static_cast<size_t>(r) * block;
        std::vector<unsigned char> out(block * es);
        CollectiveOptions opts;
        opts.seq = 3;
        load();
        reduceScatter(ctx, buf, out.data(), block, d, ReduceOp::kAvg, opts);
        EXPECT_EQ(mismatches(rs, rsAvg, out.data(), mine, block, what + " reduce_scatter avg"), 0);
        opts.seq = 4;
        load();
        reduceScatter(ctx, buf, buf + mine * es, block, d, ReduceOp::kSum, opts);
        EXPECT_EQ(mismatches(rs, rsSum, buf + mine * es, mine, block,
                             what + " reduce_scatter sum in place"),
                  0);
        // Shifted against its block, the output would overwrite what a peer reads in place:
        // refused before any message, as in every mode (sweep_data_test's Aliasing).
        opts.seq = 5;
        const size_t shifted = r == 0 ? 1 : mine - 1;  // one element off, inside the input
        EXPECT_THROW(reduceScatter(ctx, buf, buf + shifted * es, block, d, ReduceOp::kSum, opts),
                     InvalidArgumentError);
      });
    }
  }
  // Rank 0's buffer in a Window, the others' not: the mode's collective would have taken the
  // window path on rank 0, so every rank fails naming both paths.
  const int n = 3;
  const auto bothPathsNamed = [&](size_t elements,
                                  const std::function<void(Context&, float*)>& call) {
    const auto errors = errorsOnRanks(
        n,
        [](int, ContextOptions& o) {
          o.reproducible = true;
          o.shmWindowMinBytes = 1;
        },
        [&](int r, Context& ctx) {
          std::shared_ptr<Window> win;
          std::vector<float> plain;
          float* buf = nullptr;
          if (r == 0) {
            win = Window::allocate(elements * sizeof(float));
            buf = static_cast<float*>(win->data());
          } else {
            plain.assign(elements, 1.0f);
            buf = plain.data();
          }
          call(ctx, buf);
        });
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(errors[r].find("zero-copy window"), std::string::npos)
          << "rank " << r << ": " << errors[r];
      EXPECT_NE(errors[r].find("staged"), std::string::npos) << "rank " << r << ": " << errors[r];
    }
  };
  const size_t count = 70001;
  bothPathsNamed(count, [&](Context& ctx, float* buf) {
    CollectiveOptions opts;
    opts.seq = 3;
    allreduce(ctx, buf, buf, count, DType::kFloat32, ReduceOp::kSum, opts);
  });
  bothPathsNamed(count, [&](Context& ctx, float* buf) {
    CollectiveOptions opts;
    opts.seq = 5;
    reduce(ctx, buf, buf, count, DType::kFloat32, ReduceOp::kSum, 1, opts);
  });
  const size_t block = 7001;
  bothPathsNamed(block * n, [&](Context& ctx, float* buf) {
    std::vector<float> out(block);
    CollectiveOptions opts;
    opts.seq = 4;
    reduceScatter(ctx, buf, out.data(), block, DType::kFloat32, ReduceOp::kSum, opts);
  });
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

// From three ranks on, all-reduce and reduce exchange large buffers chunk by chunk (blocks of
// 65,536 elements per rank): over three chunks, the last one padded, with elements refined in
// more than one of them, the results equal the local arithmetic's bit for bit.
TEST(ReproducibleRanks, ChunkedExchangeMatchesTheArithmetic) {
  for (const Config& config :
       {Config{true, Algorithm::kAuto, 512 << 10}, Config{false, Algorithm::kRing, 512 << 10}}) {
    const int n = config.shm ? 3 : 4;           // two ranks take the pair path
    const size_t total = 65536 * n * 2 + 6785;  // two whole chunks and one padded
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

// Over shared memory the mode's exchange is one staged collective whose signature says the
// reduction is exact (shm::allreduceRows): a rank that runs the ordinary all-reduce against it
// (the mode on for one rank's call only) fails at the first step, on every rank, with both
// signatures, instead of the two reductions mixing.
TEST(ReproducibleRanks, OrdinaryAgainstExactFailsOverShm) {
  const int n = 3;
  const size_t total = 65536 * n;
  const auto errors = errorsOnRanks(
      n, [](int, ContextOptions&) {},
      [&](int r, Context& ctx) {
        std::vector<float> buf(total, 1.0f);
        CollectiveOptions opts;
        opts.seq = 9;
        opts.reproducible = r == 0;
        allreduce(ctx, buf.data(), buf.data(), total, DType::kFloat32, ReduceOp::kSum, opts);
      });
  std::string all;
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r], "") << "rank " << r << " did not fail";
    all += errors[r] + "\n";
  }
  EXPECT_NE(all.find("op=sum, exact"), std::string::npos) << all;
}

// Two ranks run all-reduce and reduce 4 MiB of input at a time (1,048,576 float32 elements):
// over three chunks, the last one short, with specials and near-ties among ordinary values, the
// results equal the local arithmetic's (the windowed integer path) bit for bit, and every rank
// gets the same whichever input it holds.
TEST(ReproducibleRanks, PairChunksMatchTheArithmetic) {
  const size_t total = (size_t{4} << 20) / 4 * 2 + 12345;
  std::mt19937 rng(31);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(2, std::vector<float>(total));
  for (size_t i = 0; i < total; ++i) {
    rows[0][i] = g(rng);
    rows[1][i] = i % 1000 == 7   ? -rows[0][i]                             // cancellation
                 : i % 1000 == 9 ? std::nextafter(rows[0][i], 1e30f)       // near ties
                 : i % 5003 == 0 ? std::numeric_limits<float>::infinity()  // specials
                 : i % 5011 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                 : g(rng) * 1e-3f;
  }
  const void* ptrs[] = {rows[0].data(), rows[1].data()};
  std::vector<float> sum(total), avg(total);
  reproducibleReduceLocal(ptrs, sum.data(), total, DType::kFloat32, ReduceOp::kSum,
                          ReproduciblePath::kWindowed);
  reproducibleReduceLocal(ptrs, avg.data(), total, DType::kFloat32, ReduceOp::kAvg,
                          ReproduciblePath::kWindowed);
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (const Config& config :
       {Config{true, Algorithm::kAuto, 512 << 10}, Config{false, Algorithm::kRing, 64 << 10}}) {
    const std::string what = describe(config, 2);
    onRanks(2, config, [&](int r, Context& ctx) {
      std::vector<float> out(total);
      CollectiveOptions opts;
      opts.seq = 1;
      allreduce(ctx, rows[1 - r].data(), out.data(), total, DType::kFloat32, ReduceOp::kSum, opts);
      EXPECT_TRUE(same(out, sum)) << what << " allreduce sum";
      out = rows[r];
      opts.seq = 2;
      allreduce(ctx, out.data(), out.data(), total, DType::kFloat32, ReduceOp::kAvg, opts);
      EXPECT_TRUE(same(out, avg)) << what << " allreduce avg in place";
      std::fill(out.begin(), out.end(), 0.0f);
      opts.seq = 3;
      reduce(ctx, rows[r].data(), r == 0 ? out.data() : nullptr, total, DType::kFloat32,
             ReduceOp::kSum, 0, opts);
      if (r == 0) {
        EXPECT_TRUE(same(out, sum)) << what << " reduce";
      }
    });
  }
}

// Two ranks: AVG where the two sums overflow but the average does not (the largest finite values,
// and values from the overflow threshold up), next to infinities, NaN and subnormals; every
// dtype (float16's AVG takes the raw exchange, the others the ordinary all-reduce and the
// overflow round), in place and not, with the rank threads in flush-to-zero and
// denormals-are-zero, which must change nothing; against the one-pass integer path.
TEST(ReproducibleRanks, PairOverflowsAndFlushToZero) {
  for (DType d : kDTypes) {
    const size_t width = dtypeSize(d);
    const int bits = static_cast<int>(width) * 8;
    const uint64_t sign = uint64_t{1} << (bits - 1);
    const int mantissa = d == DType::kFloat32   ? 23
                         : d == DType::kFloat64 ? 52
                         : d == DType::kFloat16 ? 10
                                                : 7;
    const int exponentBits = bits - 1 - mantissa;
    const uint64_t inf = ((uint64_t{1} << exponentBits) - 1) << mantissa;
    const uint64_t largest = inf - 1;
    const int emax = (1 << (exponentBits - 1)) - 1;
    const auto power = [&](int e) {  // 2^e, normal
      return static_cast<uint64_t>(e + emax) << mantissa;
    };
    const uint64_t threshold = power(emax - mantissa - 1);  // 2^(emax - p)
    // Pairs (rank 0, rank 1), repeated with a spacing so that they land in several places.
    const std::vector<std::pair<uint64_t, uint64_t>> pairs = {
        {largest, largest},
        {largest, threshold},
        {largest, threshold - 1},
        {largest | sign, largest | sign},
        {largest, largest | sign},
        {threshold, threshold},
        {inf, largest},
        {inf, inf | sign},
        {inf | (inf >> 1), 1},  // NaN with a payload
        {1, 3},                 // subnormals
        {power(0), 1},
        {largest - 5, power(emax - 1) + 7},
    };
    const size_t count = 3001;
    std::vector<std::vector<unsigned char>> rows(2, std::vector<unsigned char>(count * width));
    std::mt19937_64 rng(static_cast<uint64_t>(d) + 5);
    for (size_t i = 0; i < count; ++i) {
      uint64_t v[2];
      if (i % 7 == 0) {
        const auto& p = pairs[(i / 7) % pairs.size()];
        v[0] = p.first;
        v[1] = p.second;
      } else {
        v[0] = power(static_cast<int>(rng() % 8)) | (rng() & (inf >> exponentBits));
        v[1] = power(static_cast<int>(rng() % 8)) | (rng() & (inf >> exponentBits));
      }
      for (int r = 0; r < 2; ++r) std::memcpy(rows[r].data() + i * width, &v[r], width);
    }
    const void* ptrs[] = {rows[0].data(), rows[1].data()};
    std::vector<unsigned char> sum(count * width), avg(count * width);
    reproducibleReduceLocal(ptrs, sum.data(), count, d, ReduceOp::kSum, ReproduciblePath::kOnePass);
    reproducibleReduceLocal(ptrs, avg.data(), count, d, ReduceOp::kAvg, ReproduciblePath::kOnePass);
    // The AVX2 passes and the scalar ones (ReduceIsa::kGeneric), over shm and tcp.
    for (int run = 0; run < 4; ++run) {
      const Config config = run % 2 == 0 ? Config{true, Algorithm::kAuto, 512 << 10}
                                         : Config{false, Algorithm::kRing, 4096};
      setReduceIsa(run < 2 ? ReduceIsa::kAuto : ReduceIsa::kGeneric);
      const std::string what = describe(config, 2) + " " + dtypeName(d) + " " + reduceKernelIsa();
      onRanks(2, config, [&](int r, Context& ctx) {
#if defined(__x86_64__)
        _mm_setcsr(_mm_getcsr() | 0x8040u);  // flush-to-zero, denormals-are-zero
#endif
        std::vector<unsigned char> out(count * width);
        CollectiveOptions opts;
        opts.seq = 1;
        allreduce(ctx, rows[r].data(), out.data(), count, d, ReduceOp::kAvg, opts);
        EXPECT_TRUE(out == avg) << what << " allreduce avg";
        out = rows[r];
        opts.seq = 2;
        allreduce(ctx, out.data(), out.data(), count, d, ReduceOp::kAvg, opts);
        EXPECT_TRUE(out == avg) << what << " allreduce avg in place";
        opts.seq = 3;
        allreduce(ctx, rows[r].data(), out.data(), count, d, ReduceOp::kSum, opts);
        EXPECT_TRUE(out == sum) << what << " allreduce sum";
        opts.seq = 4;
        reduceScatter(ctx, rows[r].data(), out.data(), 1500, d, ReduceOp::kSum, opts);
        EXPECT_EQ(std::memcmp(out.data(), sum.data() + r * 1500 * width, 1500 * width), 0)
            << what << " reduce_scatter sum";
#if defined(__x86_64__)
        EXPECT_EQ(_mm_getcsr() & 0x8040u, 0x8040u) << "the caller's environment changed";
        _mm_setcsr(_mm_getcsr() & ~0x8040u);
#endif
      });
    }
    setReduceIsa(ReduceIsa::kAuto);
  }
}

}  // namespace
}  // namespace loom::comm
