// How the tuner works: for each operation whose automatic choice depends on the size
// (all-reduce, broadcast, all-gather, reduce-scatter; with 2 ranks only all-reduce's recursive
// doubling against the ring differ), every algorithm it implements is timed at per-rank sizes from
// 4 KiB to --tune-max (64 MiB by default; x4). A sample is a few warm-up calls, then a loop whose
// time is the slowest rank's (an all-reduce of the elapsed times, so every rank takes the same
// decisions); at each size the candidates are sampled in turn, kSamples times (the order reversed
// every other time), and compared by their medians, so that a slow moment of the machine hits every
// candidate alike and one stray sample decides nothing. The winner at a size is the fastest median,
// unless the built-in choice is within kKeepBuiltinMargin of it; a lone winner between two sizes
// that another algorithm won stands only when it beat that one by kIslandMargin. The file gets the
// winners as per-size rules (OP.rules, each from halfway between two measured sizes) and, for
// readers of the crossovers, the largest size up to which the small-message algorithm won at every
// size (0 when it lost at the smallest).
//
// Shared memory (every rank on this host, cross-memory attach usable): all-reduce, broadcast,
// all-gather and reduce-scatter are also timed through two more Contexts, one that always
// stages (LOOM_SHM_SINGLE_COPY=off) and one that always reads peers with process_vm_readv
// (=on), at per-rank sizes from 16 KiB to --tune-max (x4), sampled in turn in the same way. The
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
#include "loom/comm/tuning_cache.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace loom::bench {

namespace {

using comm::Algorithm;
using Clock = std::chrono::steady_clock;

constexpr size_t kMinBytes = size_t{4} << 10;
// Bytes per rank one sample moves through the operation (at least 2 calls, at most 100).
constexpr size_t kSampleBytes = size_t{16} << 20;
constexpr size_t kCrossMemoryMinBytes = size_t{16} << 10;
// The single copy must be this much faster (time ratio) to be chosen: a tie stays staged.
constexpr double kCrossMemoryMargin = 1.05;
// The built-in choice at a size stays unless another candidate's median beats it by more than
// this (time ratio): noise does not move a default.
constexpr double kKeepBuiltinMargin = 1.05;
// A winner at one size between two sizes that another algorithm won must beat that one by more
// than this to stand.
constexpr double kIslandMargin = 1.15;
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
  Tuner(comm::Context& ctx, size_t maxBytes, std::chrono::milliseconds timeout)
      : ctx_(ctx), maxBytes_(maxBytes) {
    opts_.timeout = timeout;
  }

  size_t maxBytes() const { return maxBytes_; }

  // Seconds per call of `op` with `algorithm` at `bytes` per rank (the slowest rank's).
  double time(OpType op, Algorithm algorithm, size_t bytes) {
    const size_t count = bytes / sizeof(float);
    const int size = ctx_.size();
    in_.assign(op == OpType::kReduceScatter ? count * size : count, 1.0f);
    out_.assign(op == OpType::kAllgather ? count * size : count, 0.0f);
    // About 16 MiB per rank per sample (kSamples of them per candidate and size), and at least
    // a few milliseconds at small sizes.
    const int iters = static_cast<int>(std::clamp<size_t>(kSampleBytes / bytes, 2, 100));
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

  // Every candidate's median time at every size from kMinBytes to maxBytes() (x4).
  struct Sweep {
    std::vector<size_t> sizes;
    std::vector<std::vector<double>> medians;  // [size][candidate]
  };
  Sweep sweep(OpType op, const std::vector<Algorithm>& candidates) {
    Sweep s;
    for (size_t bytes = kMinBytes; bytes <= maxBytes_; bytes *= 4) {
      std::vector<std::function<double()>> timed;
      for (Algorithm a : candidates) timed.push_back([&, a, bytes] { return time(op, a, bytes); });
      s.sizes.push_back(bytes);
      s.medians.push_back(sampledMedians(timed));
    }
    return s;
  }

 private:
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
  const size_t maxBytes_;
  comm::CollectiveOptions opts_;
  uint64_t seq_ = 0;
  std::vector<float> in_, out_;
  Clock::time_point start_;
};

// The winner at each size of a sweep: the fastest candidate, unless the built-in choice for
// that size is within kKeepBuiltinMargin of it (a tie keeps the default).
std::vector<Algorithm> winners(const Tuner::Sweep& s, const std::vector<Algorithm>& candidates,
                               OpType op, int size) {
  const comm::Crossovers builtin = comm::builtinCrossovers(size);
  std::vector<Algorithm> won;
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    const std::vector<double>& t = s.medians[i];
    const size_t best = std::min_element(t.begin(), t.end()) - t.begin();
    const Algorithm def = comm::automaticAlgorithm(op, s.sizes[i], size, builtin);
    const auto d = std::find(candidates.begin(), candidates.end(), def);
    const bool keep =
        d != candidates.end() && t[d - candidates.begin()] <= t[best] * kKeepBuiltinMargin;
    won.push_back(keep ? def : candidates[best]);
  }
  // An island (one size whose winner differs from both neighbours, which agree) stands only
  // if it beat the neighbours' algorithm there by kIslandMargin: times change smoothly with
  // the size, a slow sample does not.
  auto index = [&](Algorithm a) {
    return std::find(candidates.begin(), candidates.end(), a) - candidates.begin();
  };
  for (size_t i = 1; i + 1 < won.size(); ++i) {
    const Algorithm around = won[i - 1];
    if (won[i] == around || won[i + 1] != around) continue;
    const std::vector<double>& t = s.medians[i];
    if (t[index(around)] <= t[index(won[i])] * kIslandMargin) won[i] = around;
  }
  return won;
}

// Per-size rules from the winners: each winner holds from halfway (geometrically) below its
// size, the first from 0.
comm::SizeRules rulesFrom(const std::vector<size_t>& sizes, const std::vector<Algorithm>& won) {
  comm::SizeRules rules;
  for (size_t i = 0; i < won.size(); ++i) {
    if (!rules.empty() && rules.back().algorithm == won[i]) continue;
    rules.push_back({i == 0 ? 0 : sizes[i - 1] * 2, won[i]});
  }
  return rules;
}

// The largest size up to which every winner was one of `small` (`from` when the first was not).
size_t prefixMax(const std::vector<size_t>& sizes, const std::vector<Algorithm>& won,
                 std::initializer_list<Algorithm> small, size_t from = 0) {
  size_t max = from;
  for (size_t i = 0; i < won.size(); ++i) {
    if (sizes[i] <= from) continue;
    if (std::find(small.begin(), small.end(), won[i]) == small.end()) break;
    max = sizes[i];
  }
  return max;
}

// Prints one operation's sweep (rank 0): the median time of every candidate, the winner marked.
void printSweep(std::ostream& out, OpType op, const Tuner::Sweep& s,
                const std::vector<Algorithm>& candidates, const std::vector<Algorithm>& won) {
  out << "# " << opTypeName(op) << ": median us per call";
  for (Algorithm a : candidates) out << "  " << comm::algorithmName(a);
  out << "  -> chosen\n";
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    out << "#   " << s.sizes[i];
    for (double t : s.medians[i]) out << "  " << static_cast<long long>(t * 1e7) / 10.0;
    out << "  -> " << comm::algorithmName(won[i]) << "\n";
  }
}

// The shared-memory single copy's range for `op`: staged and cross-memory sampled in turn at
// each size, their medians compared; the longest run of sizes where it won by the margin.
comm::CrossMemoryRange crossMemoryRange(Tuner& staged, Tuner& single, OpType op) {
  comm::CrossMemoryRange best, run;
  for (size_t bytes = kCrossMemoryMinBytes; bytes <= staged.maxBytes(); bytes *= 4) {
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
void tuneCrossMemory(Store& store, int rank, int size, size_t maxBytes,
                     std::chrono::milliseconds timeout, const comm::Context& ctx,
                     comm::Crossovers& x) {
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
  Tuner staged(*stagedCtx, maxBytes, timeout), single(*singleCtx, maxBytes, timeout);
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

int runTune(Store& store, int rank, int size, const std::string& path, size_t maxBytes,
            std::chrono::milliseconds timeout) {
  comm::ContextOptions options;
  options.timeout = timeout;
  options.storePrefix = "loom-tune";
  auto ctx = comm::Context::create(store, rank, size, options);
  Tuner tuner(*ctx, maxBytes, timeout);
  comm::Crossovers x = comm::builtinCrossovers(size);
  std::ostringstream report;
  if (size > 1) {
    struct Tuned {
      OpType op;
      std::vector<Algorithm> candidates;
      comm::SizeRules* rules;
    };
    // With 2 ranks direct and recursive doubling are one exchange, as are direct and ring
    // all-gather and reduce-scatter, and every broadcast is one hop: only rd against the ring
    // differs, and timing the same thing twice would let noise write rules.
    std::vector<Tuned> ops;
    if (size == 2) {
      ops = {{OpType::kAllreduce,
              {Algorithm::kRecursiveDoubling, Algorithm::kRing},
              &x.allreduceRules}};
    } else {
      ops = {
          {OpType::kAllreduce,
           {Algorithm::kRecursiveDoubling, Algorithm::kRing, Algorithm::kHalvingDoubling,
            Algorithm::kDirect},
           &x.allreduceRules},
          {OpType::kBroadcast,
           {Algorithm::kTree, Algorithm::kChain, Algorithm::kDirect},
           &x.broadcastRules},
          {OpType::kAllgather, {Algorithm::kDirect, Algorithm::kRing}, &x.allgatherRules},
          {OpType::kReduceScatter, {Algorithm::kDirect, Algorithm::kRing}, &x.reduceScatterRules}};
    }
    for (const Tuned& t : ops) {
      const Tuner::Sweep s = tuner.sweep(t.op, t.candidates);
      const std::vector<Algorithm> won = winners(s, t.candidates, t.op, size);
      if (rank == 0) printSweep(report, t.op, s, t.candidates, won);
      *t.rules = rulesFrom(s.sizes, won);
      // The crossovers say the same where one crossover can.
      switch (t.op) {
        case OpType::kAllreduce:
          x.allreduceRdMax = prefixMax(s.sizes, won, {Algorithm::kRecursiveDoubling});
          x.allreduceHdMax =
              size >= 4 && (size & (size - 1)) == 0
                  ? prefixMax(s.sizes, won, {Algorithm::kHalvingDoubling}, x.allreduceRdMax)
                  : 0;
          break;
        case OpType::kBroadcast:
          x.broadcastTreeMax = prefixMax(s.sizes, won, {Algorithm::kTree});
          break;
        case OpType::kAllgather:
          x.gatherDirectMax = prefixMax(s.sizes, won, {Algorithm::kDirect});
          break;
        default:
          break;
      }
    }
    tuneCrossMemory(store, rank, size, maxBytes, timeout, *ctx, x);
  }
  if (rank != 0) return 0;
  const std::string& key = ctx->topology();
  const std::string section = comm::formatTuning(key, x, true);
  std::string target = path;
  const bool json = path.empty() || (path.size() > 5 && path.substr(path.size() - 5) == ".json");
  if (path.empty()) {
    const std::string directory =
        comm::tuningCacheDirectory(settings::text("LOOM_TUNING_CACHE").value_or(""));
    if (directory.empty()) {
      std::cerr << "loom-bench: no tuning cache directory (LOOM_TUNING_CACHE is off, and neither "
                   "XDG_CACHE_HOME nor HOME is set); pass --tune FILE"
                << std::endl;
      return 2;
    }
    target = comm::tuningCachePath(directory, comm::hostFacts());
  }
  if (json) {
    try {
      comm::writeTuningCache(target, key, x, comm::hostFacts());
    } catch (const Error& e) {
      std::cerr << "loom-bench: " << e.what() << std::endl;
      return 3;
    }
  } else {
    const std::string text = merged(target, key, section);
    std::ofstream out(target + ".tmp");
    out << text;
    out.close();
    if (!out || std::rename((target + ".tmp").c_str(), target.c_str()) != 0) {
      std::cerr << "loom-bench: cannot write tuning file " << target << ": "
                << detail::errnoText(errno) << std::endl;
      return 3;
    }
  }
  std::cout << report.str() << "# wrote " << target
            << (path.empty() ? " (this host's tuning cache: every group on this host reads it; "
                               "LOOM_TUNING_FILE overrides it)\n"
                             : detail::str(" (load it with LOOM_TUNING_FILE=", target, ")\n"))
            << section;
  return 0;
}

}  // namespace loom::bench
