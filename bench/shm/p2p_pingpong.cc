// loom_p2p_pingpong: round trips of one message between two forked ranks through the
// Context's transport (comm send/recv), as latency (half the round trip) and bandwidth.
//
//   loom_p2p_pingpong --sizes 8,65536,1048576,67108864 --seconds 0.5
//   LOOM_SHM_P2P=0 loom_p2p_pingpong ...   (the same over loopback tcp)
//
// Prints bytes, median and min one-way time (µs) and the bandwidth of the median (GB/s).
// Not a test: a shared 2-core VM is noisy; compare runs side by side.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/store/file_store.h"

namespace {

using Clock = std::chrono::steady_clock;

int runRank(int rank, const std::string& storePath, const std::vector<size_t>& sizes,
            double seconds) {
  loom::FileStore store(storePath);
  loom::comm::ContextOptions options;
  options.host = "127.0.0.1";
  options.timeout = std::chrono::seconds(60);
  auto ctx = loom::comm::Context::create(store, rank, 2, options);
  if (rank == 0) std::printf("# transport: %s\n", ctx->transport().name());
  std::printf(rank == 0 ? "%12s %12s %12s %10s\n" : "", "bytes", "median_us", "min_us", "GB/s");
  const int peer = 1 - rank;
  for (size_t bytes : sizes) {
    std::vector<uint8_t> buf(std::max<size_t>(bytes, 1), static_cast<uint8_t>(rank));
    auto once = [&] {
      if (rank == 0) {
        loom::comm::send(*ctx, buf.data(), bytes, loom::DType::kUInt8, peer, 1);
        loom::comm::recv(*ctx, buf.data(), bytes, loom::DType::kUInt8, peer, 2);
      } else {
        loom::comm::recv(*ctx, buf.data(), bytes, loom::DType::kUInt8, peer, 1);
        loom::comm::send(*ctx, buf.data(), bytes, loom::DType::kUInt8, peer, 2);
      }
    };
    for (int i = 0; i < 3; ++i) once();
    // Rank 0 decides the iteration count and tells rank 1 (both must run the same number).
    int64_t iters = 0;
    const auto t0 = Clock::now();
    once();
    if (rank == 0) {
      const double one = std::chrono::duration<double>(Clock::now() - t0).count();
      iters = std::clamp<int64_t>(static_cast<int64_t>(seconds / std::max(one, 1e-7)), 5, 100000);
    }
    loom::comm::broadcast(*ctx, &iters, 1, loom::DType::kInt64, 0);
    std::vector<double> times;
    times.reserve(static_cast<size_t>(iters));
    for (int64_t i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      once();
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (rank == 0) {
      std::printf("%12zu %12.2f %12.2f %10.3f\n", bytes, median, times.front(),
                  static_cast<double>(bytes) / median / 1e3);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Point-to-point ping-pong between two forked ranks"};
  std::vector<size_t> sizes{8, 4096, 65536, 1048576, 16777216, 67108864};
  double seconds = 0.5;
  app.add_option("--sizes", sizes, "message sizes in bytes")->delimiter(',');
  app.add_option("--seconds", seconds, "target time per size");
  CLI11_PARSE(app, argc, argv);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("loom-p2p-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = runRank(rank, dir + "/store", sizes, seconds);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(stdout);
      ::_exit(rc);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  std::filesystem::remove_all(dir);
  return failed;
}
