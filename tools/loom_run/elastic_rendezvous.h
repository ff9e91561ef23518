// ElasticRendezvous: how the loom-run agents of an elastic job (--nnodes MIN:MAX) agree, round
// after round, on which of them form the world.
//
// Keys live under "loom-run/<run id>/" of a store that no agent hosts (--rdzv-endpoint, a
// loom-store, ideally with --data-dir so that it survives its own restart):
//   round                 the newest round (generation) agents should join: "0", "1", ...
//   g<g>/arrivals         how many agents arrived at round g (add): arrival i is node i
//   g<g>/node/<i>         arrival i: "nproc=<N>;host=<name>;addr=<address>"
//   g<g>/closed           how many arrivals the round admitted (compareSet: one decision)
//   g<g>/worker_port      node 0's pick for the workers' MASTER_PORT in round g
// and, while the round runs, the keys of Rendezvous (rendezvous.h: heartbeats, end, done).
//
// How a round closes. Each agent adds itself to arrivals, then waits in slices until the round
// is closed. It closes it itself, with compareSet on `closed`, once MAX agents arrived, or once
// MIN arrived and no one else came for the last-call time (so that the survivors of a failure
// do not wait for the dead). The first compareSet is the decision: arrivals 0..closed-1 are
// the round's nodes (node rank = arrival number); a later arrival is told it is late and waits
// for the next round, which the running nodes start as soon as they see it waiting (arrivals
// beyond closed while the round has fewer than MAX nodes): a rejoining node is taken into the
// next round. Fewer than MIN agents by the rendezvous timeout: TimeoutError saying how many came.
// An admitted arrival that never publishes its node key (its agent died right after arriving)
// makes every admitted agent abandon the round after 10 s and meet in the next one.
//
// Ending a round: the agents of round g move to g+1 by compareSet(round, g, g+1) and join it.
// Not thread-safe; one per loom-run.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/store/store.h"

namespace loom::run {

struct ElasticOptions {
  std::string runId = "default";
  int minNodes = 1;
  int maxNodes = 1;
  int nprocPerNode = 1;
  std::string hostname;
  std::string address;   // where this node's workers can be reached (MASTER_ADDR as node 0)
  std::string endpoint;  // the store's "host:port", for messages
  milliseconds rdzvTimeout{60000};
  milliseconds lastCall{2000};
};

struct ElasticWorld {
  int generation = 0;
  int nnodes = 0;
  int nodeRank = 0;
  int worldSize = 0;
  int rankOffset = 0;
  int workerPort = 0;
  std::string masterAddr;  // node 0's address
  std::vector<std::string> hosts;
};

class ElasticRendezvous {
 public:
  ElasticRendezvous(
      Store& store, ElasticOptions options,
      std::function<bool()> interrupted = [] { return false; });

  // The round a new agent should join (creates round 0 when none exists).
  int currentRound();
  // Joins round `gen`, or the newest round after it when this agent arrives late, until it is
  // admitted. TimeoutError when a round does not reach MIN agents within the rendezvous
  // timeout; RendezvousInterrupted when loom-run is signalled.
  ElasticWorld join(int gen, const std::function<int()>& pickWorkerPort);
  // While round `gen` runs with `nnodes` nodes: why it should end for a newcomer (an agent
  // arrived after it closed and the round has room), or nullopt.
  std::optional<std::string> newcomers(int gen, int nnodes);
  // Moves the job from round `gen` to gen+1 (idempotent across agents).
  void advance(int gen);

 private:
  std::string key(int gen, const std::string& name) const;
  int64_t readInt(const std::string& key);
  // Waits until round `gen` is closed (closing it when this agent may); returns `closed`.
  int64_t awaitClose(int gen, const Deadline& deadline);

  Store& store_;
  ElasticOptions options_;
  std::function<bool()> interrupted_;
};

}  // namespace loom::run
