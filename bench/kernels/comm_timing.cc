// loom_comm_timing: times comm collectives between ranks on loopback, forked processes
// (default) or threads, and a raw TCP ping-pong as the floor for small messages.
//
//   loom_comm_timing --ranks 2 --op allreduce --sizes 8,65536,1048576,67108864 [--algo rd]
//   loom_comm_timing --pingpong
//
// Prints one line per size: bytes, median and min time of rank 0 (µs), algbw and busbw
// (GB/s, nccl-tests definitions), and what the load of a shared machine distorts less: rank
// 0's CPU time per iteration (all threads of its process, getrusage), CPU seconds per GB of
// the buffer, context switches per iteration and the kernel's share of that CPU (sys%).
// --iters fixes the iteration count (for strace -c -f), --sockbuf sets SO_SNDBUF/SO_RCVBUF.
// Not a test: numbers vary run to run on a shared 2-core VM; compare side by side.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/socket.h"
#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::comm::Context;

struct Config {
  int ranks = 2;
  std::string op = "allreduce";
  std::vector<size_t> sizes = {8, 65536, 1 << 20, 64 << 20};
  std::string algo = "auto";
  bool threads = false;
  bool inPlace = false;  // all-reduce in = out; all-gather input inside the output
  double seconds = 0.5;  // target time per size
  int64_t iters = 0;     // fixed iteration count (0: from --seconds)
  int sockbuf = 0;       // SO_SNDBUF/SO_RCVBUF bytes (0: the transport default, < 0: autotuning)
};

double busFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter") return double(n - 1) / n;
  return 1.0;
}

void runOnce(Context& ctx, const Config& cfg, float* in, float* out, size_t count,
             loom::comm::CollectiveOptions& opts) {
  ++opts.seq;
  using namespace loom::comm;
  const int n = ctx.size();
  if (cfg.op == "allreduce") {
    allreduce(ctx, cfg.inPlace ? out : in, out, count, loom::DType::kFloat32, loom::ReduceOp::kSum,
              opts);
  } else if (cfg.op == "broadcast") {
    broadcast(ctx, out, count, loom::DType::kFloat32, 0, opts);
  } else if (cfg.op == "allgather") {
    const size_t part = count / n;
    allgather(ctx, cfg.inPlace ? out + part * ctx.rank() : in, out, part, loom::DType::kFloat32,
              opts);
  } else if (cfg.op == "reduce_scatter") {
    reduceScatter(ctx, in, out, count / n, loom::DType::kFloat32, loom::ReduceOp::kSum, opts);
  } else if (cfg.op == "barrier") {
    barrier(ctx, opts);
  } else {
    std::fprintf(stderr, "unknown --op %s\n", cfg.op.c_str());
    std::exit(2);
  }
}

void rankMain(loom::Store& store, int rank, const Config& cfg) {
  loom::comm::ContextOptions copts;
  copts.host = "127.0.0.1";
  copts.timeout = std::chrono::seconds(60);
  copts.socketBufferBytes = cfg.sockbuf;
  auto ctx = Context::create(store, rank, cfg.ranks, copts);
  loom::comm::CollectiveOptions opts;
  opts.timeout = std::chrono::seconds(60);
  opts.algorithm = loom::comm::parseAlgorithm(cfg.algo);
  if (rank == 0) {
    std::printf("# %s, %d %s ranks, algo %s, float32%s\n", cfg.op.c_str(), cfg.ranks,
                cfg.threads ? "thread" : "process", cfg.algo.c_str(),
                cfg.inPlace ? ", in place" : "");
    std::printf("%12s %10s %10s %10s %10s %10s %10s %8s %5s %10s\n", "bytes", "median_us", "min_us",
                "algbw", "busbw", "cpu_us/it", "cpu_s/GB", "csw/it", "sys%", "batch_ns");
  }
  for (size_t bytes : cfg.sizes) {
    const size_t count = std::max<size_t>(bytes / 4, 1);
    std::vector<float> in(count * (cfg.op == "reduce_scatter" ? 1 : 1), 1.0f), out(count, 0.0f);
    // Warm up, and let rank 0 decide how many iterations fit the time budget.
    runOnce(*ctx, cfg, in.data(), out.data(), count, opts);
    const auto t0 = Clock::now();
    runOnce(*ctx, cfg, in.data(), out.data(), count, opts);
    const double one = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t iters =
        std::clamp<int64_t>(static_cast<int64_t>(cfg.seconds / std::max(one, 1e-7)), 5, 20000);
    if (cfg.iters > 0) iters = cfg.iters;
    loom::comm::broadcast(*ctx, &iters, 1, loom::DType::kInt64, 0, [&] {
      ++opts.seq;
      auto o = opts;
      o.algorithm = loom::comm::Algorithm::kAuto;
      return o;
    }());
    std::vector<double> times;
    times.reserve(iters);
    rusage ru0{}, ru1{};
    getrusage(RUSAGE_SELF, &ru0);
    for (int64_t i = 0; i < iters; ++i) {
      const auto start = Clock::now();
      runOnce(*ctx, cfg, in.data(), out.data(), count, opts);
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    getrusage(RUSAGE_SELF, &ru1);
    // The same iterations again with one clock read around all of them: the per-call time
    // without the two clock reads per iteration above (~50 ns, a quarter of a small call).
    const auto batchStart = Clock::now();
    for (int64_t i = 0; i < iters; ++i) runOnce(*ctx, cfg, in.data(), out.data(), count, opts);
    const double batchNs =
        std::chrono::duration<double, std::nano>(Clock::now() - batchStart).count() / iters;
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (rank == 0) {
      // CPU time of rank 0's process (all its threads) per iteration: what a loaded machine
      // does not distort much. cpu_s/GB: per GB of the user buffer (bytes per iteration).
      auto sec = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec * 1e-6; };
      const double cpu =
          sec(ru1.ru_utime) - sec(ru0.ru_utime) + sec(ru1.ru_stime) - sec(ru0.ru_stime);
      const double sys = sec(ru1.ru_stime) - sec(ru0.ru_stime);
      const double csw = double(ru1.ru_nvcsw - ru0.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nivcsw);
      const double algbw = bytes / (median * 1e-6) / 1e9;
      std::printf("%12zu %10.1f %10.1f %10.3f %10.3f %10.1f %10.3f %8.1f %5.0f %10.1f\n", bytes,
                  median, times.front(), algbw, algbw * busFactor(cfg.op, cfg.ranks),
                  cpu / iters * 1e6, cpu / (double(bytes) * iters) * 1e9, csw / iters,
                  cpu > 0 ? 100 * sys / cpu : 0.0, batchNs);
      std::fflush(stdout);
    }
  }
}

// Raw TCP 8-byte round trips between two processes: blocking recv, and busy-polling recv.
void pingpong() {
  loom::net::Socket listener = loom::net::listenOn("127.0.0.1", 0);
  const int port = loom::net::localPort(listener.fd());
  const int rounds = 20000;
  const pid_t child = fork();
  if (child == 0) {
    loom::net::Socket s = loom::net::connectTo("127.0.0.1", port, std::chrono::seconds(10));
    loom::net::setNoDelay(s.fd());
    char buf[8];
    for (int mode = 0; mode < 2; ++mode) {
      for (int i = 0; i < rounds; ++i) {
        size_t got = 0;
        while (got < 8) {
          const ssize_t r = recv(s.fd(), buf + got, 8 - got, mode == 1 ? MSG_DONTWAIT : 0);
          if (r > 0) got += r;
          if (r == 0) _exit(1);
        }
        if (send(s.fd(), buf, 8, MSG_NOSIGNAL) != 8) _exit(1);
      }
    }
    _exit(0);
  }
  loom::net::Socket s =
      loom::net::acceptWithDeadline(listener.fd(), loom::Deadline(std::chrono::seconds(10)));
  loom::net::setNoDelay(s.fd());
  char buf[8] = {};
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<double> times;
    for (int i = 0; i < rounds; ++i) {
      const auto start = Clock::now();
      if (send(s.fd(), buf, 8, MSG_NOSIGNAL) != 8) std::exit(1);
      size_t got = 0;
      while (got < 8) {
        const ssize_t r = recv(s.fd(), buf + got, 8 - got, mode == 1 ? MSG_DONTWAIT : 0);
        if (r > 0) got += r;
        if (r == 0) std::exit(1);
      }
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    std::printf("raw tcp 8-byte round trip (%s): median %.1f us, min %.1f us\n",
                mode == 0 ? "blocking" : "busy-poll", times[times.size() / 2], times.front());
  }
  int status = 0;
  waitpid(child, &status, 0);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool doPingpong = false;
  CLI::App app("Times loom comm collectives on loopback");
  app.add_option("--ranks", cfg.ranks, "number of ranks")->check(CLI::Range(1, 64));
  app.add_option("--op", cfg.op, "allreduce, broadcast, allgather, reduce_scatter, barrier");
  app.add_option("--sizes", cfg.sizes, "message sizes in bytes (per rank buffer)")->delimiter(',');
  app.add_option("--algo", cfg.algo, "auto, ring, rd, hd, direct, tree, chain");
  app.add_option("--seconds", cfg.seconds, "target time per size");
  app.add_option("--iters", cfg.iters, "fixed iterations per size (default: from --seconds)");
  app.add_option("--sockbuf", cfg.sockbuf,
                 "socket buffer bytes (default 0: the transport default; -1: kernel autotuning)");
  app.add_flag("--threads", cfg.threads, "ranks as threads of one process (default: processes)");
  app.add_flag("--in-place", cfg.inPlace,
               "all-reduce with in == out, all-gather with the input inside the output");
  app.add_flag("--pingpong", doPingpong, "raw TCP ping-pong baseline");
  CLI11_PARSE(app, argc, argv);
  if (doPingpong) {
    pingpong();
    return 0;
  }
  if (cfg.threads) {
    loom::HashStore store;
    std::vector<std::thread> threads;
    for (int r = 0; r < cfg.ranks; ++r) threads.emplace_back([&, r] { rankMain(store, r, cfg); });
    for (auto& t : threads) t.join();
    return 0;
  }
  char dir[] = "/tmp/loom_timing_XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        loom::FileStore store(std::string(dir) + "/store");
        rankMain(store, r, cfg);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::string cmd = std::string("rm -rf ") + dir;
  [[maybe_unused]] int ignored = std::system(cmd.c_str());
  return rc;
}
