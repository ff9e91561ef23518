// shm_baseline: what one host's memory does on this machine, the yardstick of the shared-memory
// targets (issue 19: every cell as a fraction of its physical limit). No Loom code involved.
//   memcpy         256 MiB buffers, 1 thread and 2 threads (each copying half); GB/s of bytes
//                  copied (1e9 bytes/s), the best of a few repetitions
//   cross-memory   process_vm_readv of a forked child's 256 MiB buffer into this process's, in
//                  one call and in 256 KiB calls; GB/s (the single-copy path's copy engine)
//   flag round trip  two processes bounce a counter through one shared cache line, busy
//                  spinning; median and p99 ns (the floor of a small collective's hand-over)
// Prints a small Markdown table.
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "shm_baseline: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

constexpr size_t kBytes = size_t{256} << 20;
constexpr int kRepeats = 3;

double memcpyRate(int threads) {
  std::vector<char> a(kBytes, 1), b(kBytes, 2);
  double best = 0;
  for (int r = 0; r < kRepeats; ++r) {
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    const size_t part = kBytes / threads;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { std::memcpy(b.data() + t * part, a.data() + t * part, part); });
    }
    for (auto& w : workers) w.join();
    best = std::max(best, kBytes / seconds(start, Clock::now()) / 1e9);
  }
  return best;
}

// Reads a child's buffer (at the same address as ours: fork copies the layout) with
// process_vm_readv in `step`-byte calls.
double crossMemoryRate(size_t step) {
  char* src = static_cast<char*>(std::malloc(kBytes));
  std::vector<char> dst(kBytes, 0);
  int ready[2], done[2];
  if (::pipe(ready) != 0 || ::pipe(done) != 0) die("pipe");
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  if (child == 0) {
    std::memset(src, 3, kBytes);  // the child's own pages
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) _exit(1);
    if (::read(done[0], &c, 1) != 1) _exit(1);
    _exit(0);
  }
  char c;
  if (::read(ready[0], &c, 1) != 1) die("read");
  double best = 0;
  for (int r = 0; r < kRepeats; ++r) {
    const auto start = Clock::now();
    for (size_t off = 0; off < kBytes; off += step) {
      const size_t n = std::min(step, kBytes - off);
      iovec mine{dst.data() + off, n}, theirs{src + off, n};
      if (::process_vm_readv(child, &mine, 1, &theirs, 1, 0) != static_cast<ssize_t>(n)) {
        die("process_vm_readv");
      }
    }
    best = std::max(best, kBytes / seconds(start, Clock::now()) / 1e9);
  }
  if (::write(done[1], &c, 1) != 1) die("write");
  ::waitpid(child, nullptr, 0);
  std::free(src);
  return best;
}

// Median and p99 round trip (ns) of a counter bounced between two processes.
void flagRoundTrip(double& median, double& p99) {
  constexpr int kTrips = 20000;
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap");
  auto* flag = new (mem) std::atomic<uint64_t>(0);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  if (child == 0) {
    for (uint64_t i = 1; i <= 2 * kTrips; i += 2) {
      while (flag->load(std::memory_order_acquire) != i) {
        if (Clock::now() > deadline) _exit(1);
      }
      flag->store(i + 1, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<double> ns;
  ns.reserve(kTrips);
  for (uint64_t i = 1; i <= 2 * kTrips; i += 2) {
    const auto start = Clock::now();
    flag->store(i, std::memory_order_release);
    while (flag->load(std::memory_order_acquire) != i + 1) {
      if (Clock::now() > deadline) die("flag round trip (the child stopped answering)");
    }
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count());
  }
  ::waitpid(child, nullptr, 0);
  std::sort(ns.begin(), ns.end());
  median = ns[ns.size() / 2];
  p99 = ns[ns.size() * 99 / 100];
  ::munmap(mem, 4096);
}

}  // namespace

int main() {
  const double copy1 = memcpyRate(1), copy2 = memcpyRate(2);
  const double cmaWhole = crossMemoryRate(kBytes), cmaSteps = crossMemoryRate(size_t{256} << 10);
  double median = 0, p99 = 0;
  flagRoundTrip(median, p99);
  std::printf("| shared memory | value |\n|---|---:|\n");
  std::printf("| memcpy, 256 MiB, 1 thread | %.2f GB/s |\n", copy1);
  std::printf("| memcpy, 256 MiB, 2 threads | %.2f GB/s |\n", copy2);
  std::printf("| process_vm_readv, 256 MiB, one call | %.2f GB/s |\n", cmaWhole);
  std::printf("| process_vm_readv, 256 MiB, 256 KiB calls | %.2f GB/s |\n", cmaSteps);
  std::printf("| flag round trip between two processes (median / p99) | %.0f / %.0f ns |\n", median,
              p99);
  return 0;
}
