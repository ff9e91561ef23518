// netns_worker: the PROGRAM loom-run starts on every "host" of the netns test.
//
//   netns_worker --nnodes M --nproc-per-node N
//
// 1. Checks the launcher's environment: RANK == NODE_RANK*N + LOCAL_RANK, WORLD_SIZE == M*N,
//    LOCAL_WORLD_SIZE == N, LOOM_HOST == this host's address (LOOM_TEST_ADDR), and that every
//    rank runs on the host (network namespace, named in LOOM_TEST_HOST by the test script)
//    its node rank says.
// 2. Checks all-reduce, broadcast and all-gather across the hosts, each rank filling known
//    values and comparing with the closed form:
//    - always through the job's TCPStore (every rank publishes its buffer, every rank reads
//      all of them), so the cross-host paths of the launcher and the store are tested;
//    - and, when loom_process_group is built (LOOM_NETNS_HAVE_PG), with the real collectives
//      of the tcp backend, started from the environment (env://) as any job would.
// Exits 0 when everything matched, 1 with a message naming rank, check and element otherwise.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/common/settings.h"
#include "loom/store/tcp_store.h"

#ifdef LOOM_NETNS_HAVE_PG
#include "loom/process_group/init.h"
#endif

namespace {

int envInt(const char* name) {
  const std::optional<long long> v = loom::settings::integer(name);
  if (!v) throw std::runtime_error(std::string(name) + " is not set");
  return static_cast<int>(*v);
}

std::string envStr(const char* name) {
  const std::optional<std::string> v = loom::settings::text(name);
  if (!v) throw std::runtime_error(std::string(name) + " is not set");
  return *v;
}

[[noreturn]] void fail(int rank, const std::string& what) {
  throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
}

// What rank r contributes: element i of rank r's buffer.
float valueOf(int r, size_t i) {
  return static_cast<float>(r + 1) + static_cast<float>(i % 97);
}

// Byte helpers for the store path.
loom::Bytes floatsToBytes(const std::vector<float>& v) {
  loom::Bytes b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<float> bytesToFloats(const loom::Bytes& b) {
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

void expectEqual(int rank, const char* check, const std::vector<float>& got,
                 const std::vector<float>& want) {
  if (got.size() != want.size()) {
    fail(rank, std::string(check) + ": " + std::to_string(got.size()) + " elements, expected " +
                   std::to_string(want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-3f * std::fabs(want[i]) + 1e-3f) {
      fail(rank, std::string(check) + ": element " + std::to_string(i) + " is " +
                     std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
    }
  }
}

std::vector<float> expectedSum(int world, size_t count) {
  std::vector<float> want(count, 0.0f);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) want[i] += valueOf(r, i);
  }
  return want;
}

std::vector<float> expectedGather(int world, size_t count) {
  std::vector<float> want;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) want.push_back(valueOf(r, i));
  }
  return want;
}

// Each rank says where it runs; every rank checks every other rank's host.
void checkHosts(loom::Store& store, int rank, int world, int nproc) {
  store.set("host/" + std::to_string(rank), envStr("LOOM_TEST_HOST"));
  for (int r = 0; r < world; ++r) {
    const std::string host = store.getString("host/" + std::to_string(r));
    const std::string want = "h" + std::to_string(r / nproc);
    if (host != want)
      fail(rank, "rank " + std::to_string(r) + " runs on " + host + ", expected " + want);
  }
}

void storeCollectives(loom::Store& store, int rank, int world, size_t count) {
  const std::string n = std::to_string(count);
  std::vector<float> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = valueOf(rank, i);
  // all-reduce (sum): everyone publishes, everyone adds up.
  store.set("ar/" + n + "/" + std::to_string(rank), floatsToBytes(mine));
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < world; ++r) {
    const auto theirs = bytesToFloats(store.get("ar/" + n + "/" + std::to_string(r)));
    for (size_t i = 0; i < count && i < theirs.size(); ++i) sum[i] += theirs[i];
  }
  expectEqual(rank, "store all-reduce", sum, expectedSum(world, count));
  // broadcast from the last rank (on the last host).
  const int root = world - 1;
  if (rank == root) store.set("bc/" + n, floatsToBytes(mine));
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = valueOf(root, i);
  expectEqual(rank, "store broadcast", bytesToFloats(store.get("bc/" + n)), want);
  // all-gather.
  std::vector<float> all;
  for (int r = 0; r < world; ++r) {
    const auto theirs = bytesToFloats(store.get("ar/" + n + "/" + std::to_string(r)));
    all.insert(all.end(), theirs.begin(), theirs.end());
  }
  expectEqual(rank, "store all-gather", all, expectedGather(world, count));
}

// Every rank arrives; the last one to arrive releases all. Rank 0 hosts the store, so it
// leaves last: only once every other rank has said it is leaving.
void finalBarrier(loom::Store& store, int rank, int world) {
  if (store.add("finished", 1) == world) store.set("all_finished", "1");
  store.wait({"all_finished"});
  if (rank != 0) {
    if (store.add("left", 1) == world - 1) store.set("all_left", "1");
  } else if (world > 1) {
    store.wait({"all_left"});
  }
}

#ifdef LOOM_NETNS_HAVE_PG
void check(const std::shared_ptr<loom::Work>& work) {
  work->wait();
  if (auto e = work->exception()) std::rethrow_exception(e);
}

void pgCollectives(loom::ProcessGroup& pg, int rank, int world, size_t count) {
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = valueOf(rank, i);
  check(pg.allreduce(loom::view(buf.data(), count)));
  expectEqual(rank, "all-reduce", buf, expectedSum(world, count));

  const int root = world - 1;
  for (size_t i = 0; i < count; ++i) buf[i] = rank == root ? valueOf(root, i) : -1.0f;
  loom::BroadcastOptions bo;
  bo.root = root;
  check(pg.broadcast(loom::view(buf.data(), count), bo));
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = valueOf(root, i);
  expectEqual(rank, "broadcast", buf, want);

  std::vector<float> mine(count), all(count * static_cast<size_t>(world), -1.0f);
  for (size_t i = 0; i < count; ++i) mine[i] = valueOf(rank, i);
  check(pg.allgather(loom::view(mine.data(), count), loom::view(all.data(), all.size())));
  expectEqual(rank, "all-gather", all, expectedGather(world, count));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("netns test worker (run by loom-run)", "netns_worker");
  int nnodes = 0, nproc = 0;
  app.add_option("--nnodes", nnodes, "nodes in the job")->required();
  app.add_option("--nproc-per-node", nproc, "workers per node")->required();
  CLI11_PARSE(app, argc, argv);
  int rank = -1;
  try {
    if (!loom::settings::value("RANK"))
      throw std::runtime_error("RANK is not set (run me under loom-run)");
    rank = envInt("RANK");
    const int world = envInt("WORLD_SIZE");
    const int local = envInt("LOCAL_RANK");
    const int node = envInt("NODE_RANK");
    if (world != nnodes * nproc)
      fail(rank, "WORLD_SIZE " + std::to_string(world) + " != nnodes*nproc");
    if (envInt("LOCAL_WORLD_SIZE") != nproc) fail(rank, "LOCAL_WORLD_SIZE is not --nproc-per-node");
    if (rank != node * nproc + local) fail(rank, "RANK != NODE_RANK*nproc + LOCAL_RANK");
    if (envStr("LOOM_TEST_HOST") != "h" + std::to_string(node)) {
      fail(rank, "NODE_RANK " + std::to_string(node) + " on host " + envStr("LOOM_TEST_HOST"));
    }
    // Multi-node loom-run tells the workers their address towards node 0.
    if (const std::optional<std::string> want = loom::settings::text("LOOM_TEST_ADDR")) {
      const std::optional<std::string> got = loom::settings::text("LOOM_HOST");
      if (got != want) {
        fail(rank, "LOOM_HOST is " + got.value_or("unset") + ", expected " + *want);
      }
    }
    const std::vector<size_t> counts = {1, 1000, 65536 + 3};
#ifdef LOOM_NETNS_HAVE_PG
    loom::InitOptions io;
    io.pg.timeout = std::chrono::seconds(60);
    loom::InitResult init = loom::initProcessGroup(io);
    loom::Store& store = *init.store;
#else
    loom::TCPStoreOptions so;
    so.timeout = std::chrono::seconds(60);
    so.rank = rank;
    so.isServer = rank == 0;
    so.waitForWorkers = false;
    loom::TCPStore store(envStr("MASTER_ADDR"), envInt("MASTER_PORT"), so);
#endif
    checkHosts(store, rank, world, nproc);
    for (size_t count : counts) storeCollectives(store, rank, world, count);
    std::printf("rank %d: hosts, all-reduce, broadcast, all-gather through the TCPStore ok\n",
                rank);
#ifdef LOOM_NETNS_HAVE_PG
    // Up to 4 MiB per rank, so the rate-limited link carries real traffic.
    for (size_t count : {size_t{1}, size_t{1000}, size_t{65536 + 3}, size_t{(1 << 20) + 3}}) {
      pgCollectives(*init.pg, rank, world, count);
    }
    check(init.pg->barrier());
    std::printf("rank %d: all-reduce, broadcast, all-gather with the ProcessGroup ok\n", rank);
#endif
    finalBarrier(store, rank, world);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "netns_worker: %s\n", e.what());
    return 1;
  }
}
