// loom-rpc-bench: small-RPC round trip and call rate between two processes.
//
// loom::spawn starts two ranks on this host: "server" (rank 0) serves "echo" (returns its
// argument) and "client" (rank 1) calls it. For each caller count C (default 1 and 8) the
// client starts C threads that each issue rpcSync("server", "echo", payload) back to back for
// --seconds; every call's round trip is recorded. The table gives the median and 99th
// percentile round trip (µs) and the aggregate calls/s. --async-depth D adds a row per count
// where each caller keeps D rpcAsync calls in flight (the pipelined rate).
//
//   build/bin/loom-rpc-bench [--callers 1,8] [--seconds 2] [--payload 8] [--threads 8]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/cli/checks.h"
#include "loom/common/settings.h"
#include "loom/rpc/agent.h"
#include "loom/spawn/spawn.h"
#include "loom/store/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::rpc::Value;

struct Config {
  std::vector<int> callers{1, 8};
  double seconds = 2.0;
  size_t payload = 8;
  int threads = 8;
  int asyncDepth = 0;
};

struct Row {
  const char* mode;
  int callers;
  double p50us, p99us, callsPerSecond;
  size_t calls;
};

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

Row runSync(loom::rpc::RpcAgent& agent, const Value& arg, int callers, double seconds) {
  std::vector<std::vector<double>> lat(static_cast<size_t>(callers));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  const auto runFor = std::chrono::duration<double>(seconds);
  Clock::time_point start;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      auto& mine = lat[static_cast<size_t>(t)];
      const auto end = start + runFor;
      for (Clock::time_point now = Clock::now(); now < end;) {
        agent.rpcSync("server", "echo", arg);
        const Clock::time_point after = Clock::now();
        mine.push_back(std::chrono::duration<double, std::micro>(after - now).count());
        now = after;
      }
    });
  }
  start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  const size_t n = all.size();
  return Row{"sync",
             callers,
             percentile(all, 0.5),
             percentile(all, 0.99),
             static_cast<double>(n) / elapsed,
             n};
}

Row runAsync(loom::rpc::RpcAgent& agent, const Value& arg, int callers, int depth, double seconds) {
  std::atomic<size_t> calls{0};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&] {
      std::deque<loom::rpc::Future> inFlight;
      size_t done = 0;
      while (Clock::now() < end) {
        while (static_cast<int>(inFlight.size()) < depth) {
          inFlight.push_back(agent.rpcAsync("server", "echo", arg));
        }
        inFlight.front().wait();
        inFlight.pop_front();
        ++done;
      }
      for (auto& f : inFlight) f.wait();
      calls += done + inFlight.size();
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return Row{"async", callers, 0, 0, static_cast<double>(calls) / elapsed, calls.load()};
}

void runRank(const Config& c, int rank) {
  loom::TCPStoreOptions so;
  so.isServer = rank == 0;
  so.numWorkers = 2;
  so.timeout = std::chrono::milliseconds(60000);
  const std::optional<long long> port = loom::settings::integer("MASTER_PORT");
  LOOM_CHECK(port.has_value(),
             "MASTER_PORT is not set; expected the port of the job's TCPStore "
             "(spawn and loom-run set it)");
  auto store = std::make_shared<loom::TCPStore>(
      loom::settings::text("MASTER_ADDR").value_or("127.0.0.1"), static_cast<int>(*port), so);
  loom::rpc::Registry functions;
  functions.addRaw("echo",
                   [](const Value& args, const loom::rpc::CallContext&) { return args.at(0); });
  loom::rpc::RpcOptions options;
  options.numThreads = c.threads;
  options.timeout = std::chrono::milliseconds(60000);
  loom::rpc::RpcAgent agent(rank == 0 ? "server" : "client", rank, 2, store, functions, options);
  if (rank == 1) {
    const Value arg = loom::rpc::args(Value::binary(std::vector<uint8_t>(c.payload, 7)));
    runSync(agent, arg, 1, 0.2);  // warm-up: connection, threads, allocator
    std::printf(
        "# loom-rpc-bench: echo of a %zu-byte blob, server with %d request threads, "
        "%.1f s per row\n",
        c.payload, c.threads, c.seconds);
    std::printf("%-6s %8s %12s %12s %14s %12s\n", "mode", "callers", "p50_us", "p99_us",
                "calls_per_s", "calls");
    std::vector<Row> rows;
    for (int n : c.callers) rows.push_back(runSync(agent, arg, n, c.seconds));
    if (c.asyncDepth > 0) {
      for (int n : c.callers) rows.push_back(runAsync(agent, arg, n, c.asyncDepth, c.seconds));
    }
    for (const Row& r : rows) {
      if (std::string(r.mode) == "sync") {
        std::printf("%-6s %8d %12.1f %12.1f %14.0f %12zu\n", r.mode, r.callers, r.p50us, r.p99us,
                    r.callsPerSecond, r.calls);
      } else {
        std::printf("%-6s %8d %12s %12s %14.0f %12zu\n", r.mode, r.callers, "-", "-",
                    r.callsPerSecond, r.calls);
      }
    }
    std::fflush(stdout);
  }
  agent.shutdown();
  store->set("bench/left/" + std::to_string(rank), "1");
  if (rank == 0) store->wait({"bench/left/0", "bench/left/1"});
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Loom RPC round trip and call rate, 2 processes on this host"};
  app.add_option("--callers", c.callers, "caller thread counts, one row each")->delimiter(',');
  app.add_option("--seconds", c.seconds, "time per row")->check(loom::cli::numberIn(0.01, 3600.0));
  app.add_option("--payload", c.payload, "bytes of the echoed blob")
      ->check(loom::cli::wholeIn(0, 1 << 26));
  app.add_option("--threads", c.threads, "server request threads")
      ->check(loom::cli::wholeIn(1, 1024));
  app.add_option("--async-depth", c.asyncDepth, "also rows with this many rpcAsync in flight")
      ->check(loom::cli::wholeIn(0, 100000));
  CLI11_PARSE(app, argc, argv);
  loom::SpawnOptions options;
  options.timeout = std::chrono::milliseconds(
      static_cast<long>(1000 * (c.seconds * 2 * static_cast<double>(c.callers.size()) + 60)));
  return loom::spawnMain(
      2, [&](int rank) { runRank(c, rank); }, options);
}
