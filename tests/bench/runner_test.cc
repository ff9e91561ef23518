#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/bench/data.h"
#include "loom/bench/runner.h"
#include "loom/common/error.h"
#include "loom/testing/ranks.h"

namespace loom::bench {
namespace {

std::optional<int> parse(std::vector<std::string> args, SweepFlags& flags, SweepOptions& out) {
  CLI::App app{"test", "loom-bench"};
  addSweepFlags(app, flags);
  std::vector<char*> argv;
  args.insert(args.begin(), "loom-bench");
  for (std::string& a : args) argv.push_back(a.data());
  return parseCommandLine(app, static_cast<int>(argv.size()), argv.data(),
                          [&] { out = flags.resolve(); });
}

TEST(Flags, AFlagGivenTwiceTakesItsLastValue) {
  // scripts/run.sh passes its defaults first and the user's flags after them.
  SweepFlags flags;
  SweepOptions o;
  EXPECT_EQ(
      parse({"-b", "16", "-e", "64M", "-n", "20", "--op", "all_gather", "-e", "16M"}, flags, o),
      std::nullopt);
  EXPECT_EQ(o.op, Op::kAllGather);
  EXPECT_EQ(o.minBytes, 16u);
  EXPECT_EQ(o.maxBytes, 16u << 20);
  EXPECT_EQ(o.iters, 20);
}

TEST(Flags, ParsesNcclTestsStyleFlags) {
  SweepFlags flags;
  SweepOptions o;
  EXPECT_EQ(parse({"--op",
                   "reduce_scatter",
                   "-b",
                   "1K",
                   "-e",
                   "16M",
                   "-f",
                   "4",
                   "-n",
                   "7",
                   "--small-iters",
                   "300",
                   "-w",
                   "1",
                   "-c",
                   "0",
                   "-d",
                   "bf16",
                   "-o",
                   "max",
                   "-r",
                   "1",
                   "--json",
                   "a.json",
                   "--csv",
                   "a.csv",
                   "--plot",
                   "a.svg",
                   "--series",
                   "x",
                   "--touch"},
                  flags, o),
            std::nullopt);
  EXPECT_EQ(o.op, Op::kReduceScatter);
  EXPECT_EQ(o.minBytes, 1024u);
  EXPECT_EQ(o.maxBytes, 16u << 20);
  EXPECT_EQ(o.stepFactor, 4u);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.smallIters, 300);
  EXPECT_EQ(o.warmupIters, 1);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.types, std::vector<ElemType>{ElemType::kBFloat16});
  EXPECT_EQ(o.redops, std::vector<RedOp>{RedOp::kMax});
  EXPECT_EQ(o.root, 1);
  EXPECT_EQ(o.jsonPath, "a.json");
  EXPECT_EQ(o.csvPath, "a.csv");
  EXPECT_EQ(o.plotPath, "a.svg");
  EXPECT_EQ(o.series, "x");
  EXPECT_TRUE(o.touch);
}

TEST(Flags, TouchValues) {
  SweepFlags flags;
  SweepOptions o;
  EXPECT_EQ(parse({"--touch"}, flags, o), std::nullopt);
  EXPECT_EQ(o.touchValues, SweepOptions::TouchValues::kZeros);
  SweepFlags again;
  EXPECT_EQ(parse({"--touch", "--touch-values", "gradients"}, again, o), std::nullopt);
  EXPECT_EQ(o.touchValues, SweepOptions::TouchValues::kGradients);
}

// Gradient-like values: the same per (rank, count), different between ranks, and correlated
// between them through the shared draw (each rank's variance 2e-4, the shared part 1e-4).
TEST(Data, FillGradientsSharesOneDrawBetweenRanks) {
  const size_t n = 20000;
  std::vector<float> a(n), b(n), again(n);
  fillGradients(ElemType::kFloat, 0, a.data(), n);
  fillGradients(ElemType::kFloat, 1, b.data(), n);
  fillGradients(ElemType::kFloat, 0, again.data(), n);
  EXPECT_EQ(a, again);
  double aa = 0, bb = 0, ab = 0;
  for (size_t i = 0; i < n; ++i) {
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
    ab += double{a[i]} * b[i];
  }
  EXPECT_NEAR(aa / n, 2e-4, 2e-5);
  EXPECT_NEAR(ab / std::sqrt(aa * bb), 0.5, 0.05);
  std::vector<int8_t> ints(100);
  fillGradients(ElemType::kInt8, 2, ints.data(), ints.size());
  for (int8_t v : ints) EXPECT_TRUE(v >= -3 && v <= 3) << int{v};
}

TEST(Flags, AllExpandsTypesAndReductions) {
  SweepFlags flags;
  SweepOptions o;
  EXPECT_EQ(parse({"-d", "all", "-o", "all"}, flags, o), std::nullopt);
  EXPECT_EQ(o.types.size(), 8u);
  EXPECT_EQ(o.redops.size(), 5u);
}

TEST(Flags, BadFlagsExitWithTwo) {
  for (std::vector<std::string> bad : {std::vector<std::string>{"--op", "allreduse"},
                                       {"-b", "1Q"},
                                       {"-b", "16M", "-e", "1M"},
                                       {"-f", "1"},
                                       {"-n", "0"},
                                       {"-d", "float128"},
                                       {"-o", "xor"},
                                       {"--bogus"},
                                       {"-n", "x"},
                                       {"--small-iters", "-1"},
                                       {"-r", "-1"},
                                       {"--touch-values", "gradients"},  // without --touch
                                       {"--touch", "--touch-values", "ones"}}) {
    SweepFlags flags;
    SweepOptions o;
    EXPECT_EQ(parse(bad, flags, o), 2) << bad[0];
  }
}

TEST(Flags, HelpExitsWithZero) {
  SweepFlags flags;
  SweepOptions o;
  EXPECT_EQ(parse({"--help"}, flags, o), 0);
}

TEST(Stats, SlowestRankPercentilesAndSkew) {
  // 2 ranks x 4 iterations, rank-major.
  const std::vector<double> t = {1e-6, 2e-6, 3e-6, 4e-6, 2e-6, 2e-6, 2e-6, 10e-6};
  const TimeStats s = timeStats(t, 2, 4);
  EXPECT_DOUBLE_EQ(s.meanUs, 4.0);   // rank 1: (2+2+2+10)/4
  EXPECT_NEAR(s.skewUs, 1.5, 1e-9);  // 4.0 - 2.5
  EXPECT_NEAR(s.p50Us, 2.0, 1e-9);   // per-iteration max: 2 2 3 10
  EXPECT_NEAR(s.p99Us, 10.0, 1e-9);
}

// Ranks as threads with a reference implementation of every collective, so that the sweep's
// layouts, in-place pointers, fills and checks are exercised end to end before any backend.
struct Shared {
  explicit Shared(int n) : sync(n), sends(n), doubles(n) {}
  std::barrier<> sync;
  std::vector<const void*> sends;
  std::vector<const double*> doubles;
  std::atomic<int> runs{0}, zeroInputRuns{0};  // collectives run; those whose input was all zero
};

// "Device" memory in separate host allocations that start as 0xab bytes: a sweep that ran the
// collective on its host buffers, or forgot a copy in either direction, checks wrong.
class FakeDevice : public DeviceMemory {
 public:
  void* allocate(size_t bytes) override {
    auto block = std::make_unique<std::byte[]>(bytes);
    std::memset(block.get(), 0xab, bytes);
    void* p = block.get();
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.push_back({std::move(block), bytes});
    return p;
  }
  void release(void* p) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(blocks_, [p](const Block& b) { return b.data.get() == p; });
    ++releases;
  }
  void toDevice(void* dst, const void* src, size_t bytes) override {
    expectOwned(dst, bytes, false);
    expectOwned(src, bytes, true);
    std::memcpy(dst, src, bytes);
    ++toDeviceCalls;
  }
  void toHost(void* dst, const void* src, size_t bytes) override {
    expectOwned(dst, bytes, true);
    expectOwned(src, bytes, false);
    std::memcpy(dst, src, bytes);
    ++toHostCalls;
  }
  // [p, p + bytes) lies inside one of this device's allocations.
  bool owns(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const std::byte*>(p);
    return std::any_of(blocks_.begin(), blocks_.end(), [&](const Block& block) {
      return b >= block.data.get() && b + bytes <= block.data.get() + block.bytes;
    });
  }
  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.size();
  }

  std::atomic<int> toDeviceCalls{0}, toHostCalls{0}, releases{0}, misplaced{0};

 private:
  void expectOwned(const void* p, size_t bytes, bool host) {
    if (owns(p, bytes) == host) ++misplaced;
  }
  struct Block {
    std::unique_ptr<std::byte[]> data;
    size_t bytes;
  };
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
};

class ThreadDriver : public Driver {
 public:
  ThreadDriver(Shared& shared, int rank, int n, bool corrupt, FakeDevice* device = nullptr)
      : s_(shared), rank_(rank), n_(n), corrupt_(corrupt), device_(device) {}
  DeviceMemory* deviceMemory() override { return device_; }
  std::string deviceLine() const override {
    return device_ ? " " + std::to_string(rank_) + " [fake:" + std::to_string(rank_) + "] test"
                   : Driver::deviceLine();
  }
  int rank() const override { return rank_; }
  int worldSize() const override { return n_; }
  std::string series() const override { return "reference"; }
  void barrier() override { s_.sync.arrive_and_wait(); }
  void allgatherDoubles(const double* in, size_t count, double* out) override {
    s_.doubles[rank_] = in;
    barrier();
    for (int q = 0; q < n_; ++q) std::memcpy(out + q * count, s_.doubles[q], count * 8);
    barrier();
  }
  void run(const Call& c) override {
    if (device_ != nullptr) {
      const size_t es = elemSize(c.type);
      if (c.count > 0 && (!device_->owns(c.recv, es) || !device_->owns(c.send, es))) {
        ++device_->misplaced;  // the collective must see only device pointers
      }
    }
    s_.sends[rank_] = c.send;
    const size_t k = c.count;
    if (k > 0) {
      const auto* b = static_cast<const std::byte*>(c.send);
      const size_t inputBytes = (c.op == Op::kReduceScatter ? k * n_ : k) * elemSize(c.type);
      ++s_.runs;
      if (std::all_of(b, b + inputBytes, [](std::byte x) { return x == std::byte{0}; })) {
        ++s_.zeroInputRuns;
      }
    }
    barrier();
    auto in = [&](int q, size_t i) { return loadElem(c.type, s_.sends[q], i); };
    auto red = [&](size_t i) {
      double acc = in(0, i);
      for (int q = 1; q < n_; ++q) {
        const double v = in(q, i);
        if (c.redop == RedOp::kSum || c.redop == RedOp::kAvg) acc += v;
        if (c.redop == RedOp::kProd) acc *= v;
        if (c.redop == RedOp::kMin) acc = std::min(acc, v);
        if (c.redop == RedOp::kMax) acc = std::max(acc, v);
      }
      return c.redop == RedOp::kAvg ? acc / n_ : acc;
    };
    std::vector<double> out;
    const size_t r = static_cast<size_t>(rank_);
    switch (c.op) {
      case Op::kAllReduce:
        for (size_t i = 0; i < k; ++i) out.push_back(red(i));
        break;
      case Op::kReduce:
        if (rank_ == c.root) {
          for (size_t i = 0; i < k; ++i) out.push_back(red(i));
        }
        break;
      case Op::kReduceScatter:
        for (size_t i = 0; i < k; ++i) out.push_back(red(r * k + i));
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < k; ++i) out.push_back(in(c.root, i));
        break;
      case Op::kAllGather:
      case Op::kGather:
        if (c.op == Op::kAllGather || rank_ == c.root) {
          for (int q = 0; q < n_; ++q) {
            for (size_t i = 0; i < k; ++i) out.push_back(in(q, i));
          }
        }
        break;
      case Op::kScatter:
        for (size_t i = 0; i < k; ++i) out.push_back(in(c.root, r * k + i));
        break;
      case Op::kAllToAll:
        for (int q = 0; q < n_; ++q) {
          for (size_t i = 0; i < k; ++i) out.push_back(in(q, r * k + i));
        }
        break;
      case Op::kSendRecv:
        for (size_t i = 0; i < k; ++i) out.push_back(in((rank_ + n_ - 1) % n_, i));
        break;
      case Op::kBarrier:
        break;
    }
    barrier();  // everyone has read every input before anyone writes (in-place)
    for (size_t i = 0; i < out.size(); ++i) storeElem(c.type, c.recv, i, out[i]);
    if (corrupt_ && rank_ == n_ - 1 && !out.empty()) storeElem(c.type, c.recv, 0, out[0] + 1);
    barrier();
  }

 private:
  Shared& s_;
  const int rank_;
  const int n_;
  const bool corrupt_;
  FakeDevice* const device_;
};

// Runs the sweep of an all-reduce (2 timed iterations, 1 warm-up, then `configure`) on n
// thread ranks; every rank's exit status.
std::vector<int> sweepOnRanks(int n, Shared& shared,
                              const std::function<void(SweepOptions&)>& configure) {
  std::mutex mu;
  std::vector<int> codes;
  testing::runThreadRanks(n, [&](int rank) {
    ThreadDriver driver(shared, rank, n, false);
    SweepOptions o;
    o.op = Op::kAllReduce;
    o.iters = 2;
    o.warmupIters = 1;
    configure(o);
    const int code = runSweep(driver, o, "loom-bench-test", {});
    std::lock_guard<std::mutex> lock(mu);
    codes.push_back(code);
  });
  return codes;
}

// Runs the sweep on n thread ranks; with `devices` (one per rank) on fake device memory.
int runAll(int n, Op op, const std::vector<ElemType>& types, const std::vector<RedOp>& redops,
           bool corrupt, std::vector<FakeDevice>* devices = nullptr, bool touch = false,
           Shared* counted = nullptr) {
  Shared own(n);
  Shared& shared = counted != nullptr ? *counted : own;
  std::mutex mu;
  std::vector<int> codes;
  testing::runThreadRanks(n, [&](int rank) {
    ThreadDriver driver(shared, rank, n, corrupt, devices ? &(*devices)[rank] : nullptr);
    SweepOptions o;
    o.op = op;
    o.minBytes = 1;
    o.maxBytes = 4096;
    o.stepFactor = 8;
    o.iters = 2;
    o.warmupIters = 1;
    o.types = types;
    o.redops = redops;
    o.root = n - 1;
    o.touch = touch;
    const int code = runSweep(driver, o, "loom-bench-test", {});
    std::lock_guard<std::mutex> lock(mu);
    codes.push_back(code);
  });
  for (int c : codes) {
    if (c != codes.front()) return -1;  // ranks disagree
  }
  return codes.front();
}

TEST(Sweep, EveryOpTypeAndReductionChecksCleanOnAReferenceBackend) {
  for (int n : {1, 2, 3, 4}) {
    for (Op op : allOps()) {
      EXPECT_EQ(runAll(n, op, allElemTypes(), allRedOps(), false), 0) << opName(op) << " n=" << n;
    }
  }
}

TEST(Sweep, DeviceMemoryIsFilledBeforeAndReadBackAfterEveryCheckedRun) {
  for (int n : {1, 2, 3}) {
    for (Op op : allOps()) {
      std::vector<FakeDevice> devices(n);
      EXPECT_EQ(runAll(n, op, {ElemType::kFloat, ElemType::kInt8}, {RedOp::kSum, RedOp::kMax},
                       false, &devices),
                0)
          << opName(op) << " n=" << n;
      for (FakeDevice& d : devices) {
        EXPECT_EQ(d.misplaced, 0) << opName(op) << ": a host pointer reached the collective, "
                                  << "or a copy went the wrong way";
        EXPECT_GT(d.toDeviceCalls, 0) << opName(op);
        EXPECT_GT(d.toHostCalls, 0) << opName(op);
        EXPECT_EQ(d.live(), 0u) << opName(op) << ": device buffers leaked";
        EXPECT_EQ(d.releases, 2) << opName(op);
      }
    }
  }
}

TEST(Sweep, AWrongElementOnTheDeviceFailsTheRun) {
  std::vector<FakeDevice> devices(3);
  EXPECT_EQ(runAll(3, Op::kAllReduce, {ElemType::kFloat}, {RedOp::kSum}, true, &devices), 1);
}

TEST(Sweep, AWrongElementFailsTheRunOnEveryRank) {
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kAllToAll, Op::kSendRecv}) {
    EXPECT_EQ(runAll(3, op, {ElemType::kFloat}, {RedOp::kSum}, true), 1) << opName(op);
  }
}

// --touch: every warm-up and timed run finds its input rewritten (zeros); the checked run
// finds the check data. Without it, no run sees a zeroed input.
TEST(Sweep, TouchRewritesTheInputBeforeEveryTimedRun) {
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter}) {
    for (bool touch : {false, true}) {
      Shared shared(2);
      EXPECT_EQ(runAll(2, op, {ElemType::kFloat}, {RedOp::kSum}, false, nullptr, touch, &shared),
                0);
      ASSERT_GT(shared.runs, 0);
      // Per size and placement: 1 warm-up and 2 timed runs, then 1 checked run.
      EXPECT_EQ(shared.zeroInputRuns, touch ? shared.runs * 3 / 4 : 0)
          << opName(op) << " touch=" << touch << " runs=" << shared.runs;
    }
  }
}

// --touch-values gradients: the warm-up and timed runs find gradient-like (nonzero) inputs, and
// the checked run its check data, which it passes.
TEST(Sweep, TouchWithGradientsChecksClean) {
  const int n = 2;
  Shared shared(n);
  const auto codes = sweepOnRanks(n, shared, [](SweepOptions& o) {
    o.minBytes = 1024;
    o.maxBytes = 1024;
    o.types = {ElemType::kFloat, ElemType::kHalf, ElemType::kInt32};
    o.touch = true;
    o.touchValues = SweepOptions::TouchValues::kGradients;
  });
  EXPECT_EQ(codes, std::vector<int>(n, 0));
  EXPECT_GT(shared.runs, 0);
  EXPECT_EQ(shared.zeroInputRuns, 0);
}

// --small-iters: sizes below 64 KiB run that many timed iterations, the others -n.
TEST(Sweep, SmallSizesRunSmallItersTimedIterations) {
  for (int smallIters : {0, 5}) {
    const int n = 2;
    Shared shared(n);
    const auto codes = sweepOnRanks(n, shared, [&](SweepOptions& o) {
      o.minBytes = 4096;  // 4 KiB and 32 KiB are small, 256 KiB is not
      o.maxBytes = 256 << 10;
      o.stepFactor = 8;
      o.smallIters = smallIters;
      o.check = 1;
    });
    EXPECT_EQ(codes, std::vector<int>(n, 0));
    // Per rank, size and placement: 1 warm-up, the timed runs, 1 checked run.
    const int small = smallIters > 0 ? smallIters : 2;
    EXPECT_EQ(shared.runs, n * 2 * (2 * (1 + small + 1) + (1 + 2 + 1)))
        << "smallIters=" << smallIters;
  }
}

TEST(Sweep, TouchIsRefusedOnMemoryThisProcessCannotWrite) {
  std::vector<FakeDevice> devices(1);
  try {
    runAll(1, Op::kAllReduce, {ElemType::kFloat}, {RedOp::kSum}, false, &devices, /*touch=*/true);
    ADD_FAILURE() << "--touch on device memory ran";
  } catch (const std::exception& e) {  // the thread ranks rethrow it with the rank in front
    EXPECT_NE(std::string(e.what()).find("--touch rewrites host buffers"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(devices[0].toDeviceCalls, 0) << "refused before any collective";
}

}  // namespace
}  // namespace loom::bench
