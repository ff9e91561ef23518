// libFuzzer target: loom-run's rendezvous messages (tools/loom_run/rendezvous.cc,
// elastic_rendezvous.cc): what the other nodes (or a corrupt or foreign store) left in the store
// for the values a node reads while joining: node/<r> ("nproc=N;restarts=K;host=H" and, elastic,
// ";addr=A"), worker_port, and, elastic, closed. Driven through Rendezvous::join and
// ElasticRendezvous::join over a HashStore that holds them, as a node joins.
//
// Input: byte 0 picks the mode (bit 0: static or elastic), the node count (1-4) and this node;
// the rest is the values, one a line: static node/0 .. node/N-1, worker_port; elastic closed,
// node/0 .. node/N-1, worker_port. Missing lines are filled with valid values, so that no key
// is ever waited for (every wait would take the rendezvous timeout).
//
// Properties:
// - join either forms a world or refuses with a loom::Error (InvalidArgumentError naming what
//   is wrong), never another exception (std::stoi's), never undefined behaviour;
// - a world formed adds up: one entry per node, every node with at least one process, the
//   world size is their sum, this node's rank offset the sum of those before it, the worker
//   port a TCP port, and (elastic) this node inside the round it was admitted to.
#include <chrono>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "elastic_rendezvous.h"
#include "fuzz_support.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "rendezvous.h"

namespace {

using namespace loom::run;
using namespace std::chrono_literals;

std::vector<std::string> lines(const uint8_t* data, size_t size) {
  std::vector<std::string> out;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

void put(loom::Store& store, const std::string& key, const std::string& value) {
  store.set(key, loom::toBytes(value));
}

std::string lineOr(const std::vector<std::string>& v, size_t i, const std::string& fallback) {
  return i < v.size() ? v[i] : fallback;
}

void checkWorld(int nnodes, int me, int worldSize, int rankOffset, int workerPort,
                const std::vector<int>& nprocs) {
  LOOM_FUZZ_CHECK(static_cast<int>(nprocs.size()) == nnodes, "%zu nodes in a world of %d",
                  nprocs.size(), nnodes);
  long long sum = 0, before = 0;
  for (int n = 0; n < nnodes; ++n) {
    LOOM_FUZZ_CHECK(nprocs[n] >= 1, "node %d runs %d processes", n, nprocs[n]);
    if (n < me) before += nprocs[n];
    sum += nprocs[n];
  }
  LOOM_FUZZ_CHECK(worldSize == sum && rankOffset == before, "world %d (sum %lld), offset %d (%lld)",
                  worldSize, sum, rankOffset, before);
  LOOM_FUZZ_CHECK(workerPort >= 1 && workerPort <= 65535, "worker port %d", workerPort);
}

void staticJoin(int nnodes, int me, const std::vector<std::string>& v) {
  loom::HashStore store;
  RendezvousOptions o;
  o.runId = "fuzz";
  o.nnodes = nnodes;
  o.nodeRank = me;
  o.nprocPerNode = 2;
  o.hostname = "me";
  o.rdzvTimeout = 5000ms;
  for (int n = 0; n < nnodes; ++n) {
    put(store, "loom-run/fuzz/g0/node/" + std::to_string(n),
        lineOr(v, n, "nproc=2;restarts=0;host=h" + std::to_string(n)));
  }
  put(store, "loom-run/fuzz/g0/worker_port", lineOr(v, nnodes, "29500"));
  Rendezvous r(store, o);
  World w;
  if (!loom::fuzz::rejectsOnlyWith<loom::Error>([&] { w = r.join(0, [] { return 29400; }); })) {
    return;
  }
  checkWorld(nnodes, me, w.worldSize, w.rankOffset, w.workerPort, w.nprocs);
  LOOM_FUZZ_CHECK(static_cast<int>(w.hosts.size()) == nnodes && w.generation == 0, "hosts");
}

void elasticJoin(int nnodes, int me, const std::vector<std::string>& v) {
  loom::HashStore store;
  ElasticOptions o;
  o.runId = "fuzz";
  o.minNodes = 1;
  o.maxNodes = nnodes;
  o.nprocPerNode = 2;
  o.hostname = "me";
  o.address = "10.0.0.9";
  o.rdzvTimeout = 5000ms;
  o.lastCall = 0ms;
  // This agent arrives as arrival `me`; round 0 closed as the input says. An agent that is late
  // finds round 1 started and is admitted there alone (nothing else arrives).
  store.add("loom-run/fuzz/g0/arrivals", me);
  put(store, "loom-run/fuzz/g0/closed", lineOr(v, 0, std::to_string(nnodes)));
  for (int n = 0; n < nnodes; ++n) {
    put(store, "loom-run/fuzz/g0/node/" + std::to_string(n),
        lineOr(v, 1 + n,
               "nproc=2;host=h" + std::to_string(n) + ";addr=10.0.0." + std::to_string(n)));
  }
  put(store, "loom-run/fuzz/g0/worker_port", lineOr(v, 1 + nnodes, "29500"));
  put(store, "loom-run/fuzz/round", "1");
  ElasticRendezvous r(store, o);
  ElasticWorld w;
  if (!loom::fuzz::rejectsOnlyWith<loom::Error>([&] { w = r.join(0, [] { return 29400; }); })) {
    return;
  }
  LOOM_FUZZ_CHECK(w.nnodes >= 1 && w.nnodes <= nnodes && w.nodeRank >= 0 && w.nodeRank < w.nnodes,
                  "node %d of %d admitted (at most %d)", w.nodeRank, w.nnodes, nnodes);
  LOOM_FUZZ_CHECK(static_cast<int>(w.hosts.size()) == w.nnodes, "hosts");
  LOOM_FUZZ_CHECK(w.worldSize >= w.nnodes && w.rankOffset >= 0 && w.rankOffset < w.worldSize,
                  "world %d, offset %d", w.worldSize, w.rankOffset);
  LOOM_FUZZ_CHECK(w.workerPort >= 1 && w.workerPort <= 65535, "worker port %d", w.workerPort);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int nnodes = 1 + (data[0] >> 1) % 4;
  const int me = (data[0] >> 3) % nnodes;
  const std::vector<std::string> v = lines(data + 1, size - 1);
  if (data[0] & 1) {
    elasticJoin(nnodes, me, v);
  } else {
    staticJoin(nnodes, me, v);
  }
  return 0;
}
