// How the tuner works: for each operation whose automatic choice has a size crossover, every
// candidate algorithm is timed at per-rank sizes from 4 KiB to 64 MiB (x4). A sample is a few
// warm-up calls, then a loop whose time is the slowest rank's (an all-reduce of the elapsed
// times, so every rank takes the same decisions); at each size the candidates are sampled in
// turn, kSamples times (the order reversed every other time), and compared by their medians,
// so that a slow moment of the machine hits every candidate alike and one stray sample decides
// nothing. A crossover is the largest size up to which the small-message algorithm was the
// faster at every size measured (0 when it lost at the smallest): recursive doubling before
// the others for all-reduce, then halving-doubling before ring (power-of-two worlds from 4),
// tree before chain for broadcast, direct before ring for all-gather (reduce-scatter shares
// it).
//
// Shared memory (every rank on this host, cross-memory attach usable): all-reduce, broadcast,
// all-gather and reduce-scatter are also timed through two more Contexts, one that always
// stages (LOOM_SHM_SINGLE_COPY=off) and one that always reads peers with process_vm_readv
// (=on), at per-rank sizes from 16 KiB to 64 MiB (x4), sampled in turn in the same way. The
// single copy's range (OP.cma_min / OP.cma_max) is the longest run of consecutive sizes at
// which its median beat staging's by kCrossMemoryMargin; none when it never did.
#include "tune.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/tuning.h"
#include "loom/common/error.h"

namespace loom::bench {

namespace {

using comm::Algorithm;
using Clock = std::chrono::steady_clock;

constexpr size_t kMinBytes = size_t{4} << 10;
constexpr size_t kMaxBytes = size_t{64} << 20;
constexpr size_t kCrossMemoryMinBytes = size_t{16} << 10;
// The single copy must be this much faster (time ratio) to be chosen: a tie stays staged.
constexpr double kCrossMemoryMargin = 1.05;
// Samples of every candidate at every size (odd: the median is one of them). On the 2-vCPU VMs
// two samples let a single slow moment decide a crossover (the 26 Nov 2026 Intel run chose
// single-copy ranges that lost in the table measured right after).
constexpr int kSamples = 5;

// The median time of each candidate over kSamples rounds that sample every candidate once, in
// turn (reversed in every other round).
std::vector<double> sampledMedians(const std::vector<std::function<double()>>& candidates) {
  const size_t n = candidates.size();
  std::vector<std::vector<double>> samples(n);
  for (int round = 0; round < kSamples; ++round) {
    for (size_t i = 0; i < n; ++i) {
      const size_t c = round % 2 == 0 ? i : n - 1 - i;
      samples[c].push_back(candidates[c]());
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::nth_element(s.begin(), s.begin() + kSamples / 2, s.end());
    medians.push_back(s[kSamples / 2]);
  }
  return medians;
}

class Tuner {
 public:
  Tuner(comm::Context& ctx, std::chrono::milliseconds timeout) : ctx_(ctx) {
    opts_.timeout = timeout;
  }

  // Seconds per call of `op` with `algorithm` at `bytes` per rank (the slowest rank's).
  double time(OpType op, Algorithm algorithm, size_t bytes) {
    const size_t count = bytes / sizeof(float);
    const int size = ctx_.size();
    in_.assign(op == OpType::kReduceScatter ? count * size : count, 1.0f);
    out_.assign(op == OpType::kAllgather ? count * size : count, 0.0f);
    // About 16 MiB per rank per sample (kSamples of them per candidate and size).
    const int iters = static_cast<int>(std::clamp<size_t>((kMaxBytes / 4) / bytes, 2, 20));
    for (int i = -2; i < iters; ++i) {
      if (i == 0) start_ = Clock::now();
      run(op, algorithm, count);
    }
    double elapsed = std::chrono::duration<double>(Clock::now() - start_).count() / iters;
    comm::CollectiveOptions o = opts_;
    o.seq = ++seq_;
    comm::allreduce(ctx_, &elapsed, &elapsed, 1, DType::kFloat64, ReduceOp::kMax, o);
    return elapsed;
  }

  // The largest size up to which `small` beat every one of `others` at every size from the
  // first; `from` skips the sizes at or below it.
  size_t crossover(OpType op, Algorithm small, const std::vector<Algorithm>& others,
                   size_t from = 0) {
    size_t best = from;
    for (size_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
      if (bytes <= from) continue;
      std::vector<std::function<double()>> candidates;
      candidates.push_back([&, bytes] { return time(op, small, bytes); });
      for (Algorithm a : others) candidates.push_back([&, a, bytes] { return time(op, a, bytes); });
      const std::vector<double> t = sampledMedians(candidates);
      bool wins = true;
      for (size_t i = 1; i < t.size(); ++i) wins = wins && t[0] <= t[i];
      if (!wins) break;
      best = bytes;
    }
    return best;
  }

 private:
  void run(OpType op, Algorithm algorithm, size_t count) {
    comm::CollectiveOptions o = opts_;
    o.algorithm = algorithm;
    o.seq = ++seq_;
    switch (op) {
      case OpType::kAllreduce:
        return comm::allreduce(ctx_, in_.data(), in_.data(), count, DType::kFloat32, ReduceOp::kSum,
                               o);
      case OpType::kBroadcast:
        return comm::broadcast(ctx_, in_.data(), count, DType::kFloat32, 0, o);
      case OpType::kReduceScatter:
        return comm::reduceScatter(ctx_, in_.data(), out_.data(), count, DType::kFloat32,
                                   ReduceOp::kSum, o);
      default:
        return comm::allgather(ctx_, in_.data(), out_.data(), count, DType::kFloat32, o);
    }
  }

  comm::Context& ctx_;
  comm::CollectiveOptions opts_;
  uint64_t seq_ = 0;
  std::vector<float> in_, out_;
  Clock::time_point start_;
};

// The shared-memory single copy's range for `op`: staged and cross-memory sampled in turn at
// each size, their medians compared; the longest run of sizes where it won by the margin.
comm::CrossMemoryRange crossMemoryRange(Tuner& staged, Tuner& single, OpType op) {
  comm::CrossMemoryRange best, run;
  for (size_t bytes = kCrossMemoryMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    const std::vector<double> t =
        sampledMedians({[&] { return staged.time(op, Algorithm::kAuto, bytes); },
                        [&] { return single.time(op, Algorithm::kAuto, bytes); }});
    const double s = t[0], c = t[1];
    if (c * kCrossMemoryMargin <= s) {
      if (run.max == 0) run.min = bytes;
      run.max = bytes;
      if (best.max == 0 || run.max / run.min > best.max / best.min) best = run;
    } else {
      run = {};
    }
  }
  return best;
}

// Fills x's cross-memory ranges when every rank is on this host and the single copy is usable.
void tuneCrossMemory(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                     const comm::Context& ctx, comm::Crossovers& x) {
  const std::string suffix = " transport=shm";  // every rank on this host (not shm+tcp)
  const std::string& topology = ctx.topology();
  const bool singleHost =
      topology.size() >= suffix.size() &&
      topology.compare(topology.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (size < 2 || !singleHost || !ctx.crossMemory()) return;
  comm::ContextOptions options;
  options.timeout = timeout;
  options.shmWindows = false;  // user buffers here are ordinary memory
  options.storePrefix = "loom-tune-staged";
  options.shmSingleCopy = comm::ShmSingleCopy::kOff;
  auto stagedCtx = comm::Context::create(store, rank, size, options);
  options.storePrefix = "loom-tune-cma";
  options.shmSingleCopy = comm::ShmSingleCopy::kOn;
  auto singleCtx = comm::Context::create(store, rank, size, options);
  Tuner staged(*stagedCtx, timeout), single(*singleCtx, timeout);
  x.allreduceCma = crossMemoryRange(staged, single, OpType::kAllreduce);
  x.broadcastCma = crossMemoryRange(staged, single, OpType::kBroadcast);
  x.allgatherCma = crossMemoryRange(staged, single, OpType::kAllgather);
  x.reduceScatterCma = crossMemoryRange(staged, single, OpType::kReduceScatter);
}

// `path` with the section `key` replaced by `section` (other topologies kept when the file is
// a tuning file of this version).
std::string merged(const std::string& path, const std::string& key, const std::string& section) {
  std::ifstream in(path);
  std::string line, header = section.substr(0, section.find('\n') + 1), kept;
  if (in && std::getline(in, line) && line + "\n" == header) {
    bool skip = false;
    while (std::getline(in, line)) {
      if (!line.empty() && line.front() == '[') skip = line == "[" + key + "]";
      if (!skip) kept += line + "\n";
    }
  }
  return header + kept + section.substr(header.size());
}

}  // namespace

int runTune(Store& store, int rank, int size, const std::string& path,
            std::chrono::milliseconds timeout) {
  comm::ContextOptions options;
  options.timeout = timeout;
  options.storePrefix = "loom-tune";
  auto ctx = comm::Context::create(store, rank, size, options);
  Tuner tuner(*ctx, timeout);
  comm::Crossovers x = comm::builtinCrossovers(size);
  if (size > 1) {
    const bool hd = size >= 4 && (size & (size - 1)) == 0;
    std::vector<Algorithm> large = {Algorithm::kRing};
    if (hd) large.push_back(Algorithm::kHalvingDoubling);
    x.allreduceRdMax = tuner.crossover(OpType::kAllreduce, Algorithm::kRecursiveDoubling, large);
    x.allreduceHdMax = hd ? tuner.crossover(OpType::kAllreduce, Algorithm::kHalvingDoubling,
                                            {Algorithm::kRing}, x.allreduceRdMax)
                          : 0;
    x.broadcastTreeMax =
        size <= 2 ? x.broadcastTreeMax
                  : tuner.crossover(OpType::kBroadcast, Algorithm::kTree, {Algorithm::kChain});
    x.gatherDirectMax = tuner.crossover(OpType::kAllgather, Algorithm::kDirect, {Algorithm::kRing});
    tuneCrossMemory(store, rank, size, timeout, *ctx, x);
  }
  if (rank == 0) {
    const std::string section = comm::formatTuning(ctx->topology(), x, true);
    const std::string text = merged(path, ctx->topology(), section);
    std::ofstream out(path + ".tmp");
    out << text;
    out.close();
    if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      std::cerr << "loom-bench: cannot write tuning file " << path << ": "
                << detail::errnoText(errno) << std::endl;
      return 3;
    }
    std::cout << "# wrote " << path << " (load it with LOOM_TUNING_FILE=" << path << ")\n"
              << section;
  }
  return 0;
}

}  // namespace loom::bench
