// loom-memcpy-bound: the memory limits the shared-memory collectives are measured against
// (docs/shm.md's bounds use B, one thread's memcpy bandwidth; scripts/cpu_scale_check.sh).
//
//   loom-memcpy-bound                        B at 256 KiB .. 64 MiB, then T = 1, 2, 4, .. nproc
//                                            copiers at once (64 MiB each)
//   loom-memcpy-bound --sizes 1M,64M --threads 1,8 --seconds 0.3
//   loom-memcpy-bound --threads 8,16 --concurrent-size 256K,64M
//                                            what each of 8 (16) copiers gets at once, per size:
//                                            the B a bound must use when 8 (16) ranks copy at
//                                            the same time (scripts/cpu_scale_check.sh)
//
// Each copier owns a source and a destination buffer (touched once before timing, so page faults
// are not timed) and copies source to destination for --seconds; a size's figure is the median
// of --rounds rounds. Prints Markdown tables: B per size (GB/s of bytes copied, the unit
// docs/shm.md's bounds use), and per copier count and size the slowest and fastest copier's
// rate, their sum and their mean (sum / T). Not a test: a benchmark, compared side by side within
// one run.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/bench/sizes.h"
#include "loom/cli/checks.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Copier {
  std::unique_ptr<char[]> src, dst;
  size_t bytes = 0;

  explicit Copier(size_t n) : src(new char[n]), dst(new char[n]), bytes(n) {
    std::memset(src.get(), 1, n);
    std::memset(dst.get(), 2, n);
  }

  // Copies until `seconds` have passed (at least once); returns bytes copied per second.
  double run(double seconds) {
    const auto start = Clock::now();
    const auto until = start + std::chrono::duration<double>(seconds);
    size_t copies = 0;
    do {
      std::memcpy(dst.get(), src.get(), bytes);
      // Keep the copy observable so it is not folded away.
      asm volatile("" : : "r"(dst.get()) : "memory");
      ++copies;
    } while (Clock::now() < until);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(copies * bytes) / took;
  }
};

// "256K,1M" -> sizes (loom-bench's forms); throws naming the bad entry.
std::vector<size_t> parseList(const std::string& text) {
  std::vector<size_t> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    out.push_back(loom::bench::parseSize(std::string_view(text).substr(begin, end - begin)));
    begin = end + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// T copiers at once, started together; returns each one's rate (median over rounds).
std::vector<double> concurrent(int threads, size_t bytes, double seconds, int rounds) {
  std::vector<std::unique_ptr<Copier>> copiers;
  for (int t = 0; t < threads; ++t) copiers.push_back(std::make_unique<Copier>(bytes));
  std::vector<std::vector<double>> rates(static_cast<size_t>(threads));
  for (int r = 0; r < rounds; ++r) {
    std::atomic<int> ready{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < threads) std::this_thread::yield();
        rates[static_cast<size_t>(t)].push_back(copiers[static_cast<size_t>(t)]->run(seconds));
      });
    }
    for (auto& th : pool) th.join();
  }
  std::vector<double> out;
  for (auto& r : rates) out.push_back(median(r));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "One thread's memcpy bandwidth B per size, and the rate of T copiers at once: the memory "
      "limits the shared-memory collectives are measured against (docs/shm.md).",
      "loom-memcpy-bound"};
  std::string sizesArg = "256K,1M,4M,16M,64M";
  std::string threadsArg;
  std::string concurrentSize = "64M";
  double seconds = 0.2;
  int rounds = 3;
  app.add_option("--sizes", sizesArg, "bytes per copy for the one-thread table (K, M, G)")
      ->capture_default_str();
  app.add_option("--threads", threadsArg,
                 "copier counts for the concurrent table (default 1, 2, 4, .. up to nproc)");
  app.add_option("--concurrent-size", concurrentSize,
                 "bytes each concurrent copier copies (a list: one table row per copier count "
                 "and size)")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "time per round and size")
      ->check(loom::cli::numberIn(0.01, 10.0))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds per figure; the median is printed")
      ->check(loom::cli::wholeIn(1, 101))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<size_t> sizes;
  std::vector<int> threads;
  std::vector<size_t> perCopier;
  try {
    sizes = parseList(sizesArg);
    perCopier = parseList(concurrentSize);
    if (threadsArg.empty()) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      for (int t = 1; t < cores; t *= 2) threads.push_back(t);
      threads.push_back(cores);
    } else {
      for (size_t v : parseList(threadsArg)) {
        if (v < 1 || v > 1024) throw std::invalid_argument("--threads: each count must be 1..1024");
        threads.push_back(static_cast<int>(v));
      }
    }
    for (size_t s : sizes) {
      if (s < 64) throw std::invalid_argument("--sizes: each size must be at least 64 bytes");
    }
    for (size_t s : perCopier) {
      if (s < 64)
        throw std::invalid_argument("--concurrent-size: each size must be at least 64 bytes");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-memcpy-bound: %s\n", e.what());
    return 2;
  }

  std::printf("# one thread's memcpy bandwidth B (GB/s of bytes copied), median of %d rounds\n",
              rounds);
  std::printf("| bytes | B GB/s |\n|---:|---:|\n");
  for (size_t s : sizes) {
    Copier c(s);
    std::vector<double> r;
    for (int i = 0; i < rounds; ++i) r.push_back(c.run(seconds));
    std::printf("| %zu | %.2f |\n", s, median(r) / 1e9);
    std::fflush(stdout);
  }
  std::printf("\n# T copiers at once, each copying `bytes` (GB/s; mean = sum / T)\n");
  std::printf("| T | bytes | slowest | fastest | sum | mean |\n|---:|---:|---:|---:|---:|---:|\n");
  for (int t : threads) {
    for (size_t bytes : perCopier) {
      std::vector<double> r = concurrent(t, bytes, seconds, rounds);
      double sum = 0;
      for (double v : r) sum += v;
      std::printf("| %d | %zu | %.2f | %.2f | %.2f | %.2f |\n", t, bytes,
                  *std::min_element(r.begin(), r.end()) / 1e9,
                  *std::max_element(r.begin(), r.end()) / 1e9, sum / 1e9, sum / t / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
