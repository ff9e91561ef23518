// Rendezvous: how the loom-run of each node agrees on the world through a Store, and how the
// nodes then tell each other that a generation ended (a failure, a restart, or success).
//
// Keys live under "loom-run/<run id>/g<generation>/", a fresh set for every restart:
//   node/<r>      node r arrived: "nproc=<N>;restarts=<K>;host=<name>"
//   worker_port   node 0's pick for the workers' MASTER_PORT in this generation
//   hb/<r>        node r's heartbeat counter, bumped on every poll()
//   end           why this generation ended (first writer wins, via compareSet)
//   done/<r>      node r's workers all exited 0
//   ack/<r>       node r has seen `end` and stopped its workers
//
// Every blocking step has a deadline and is sliced (about 200 ms) so that the `interrupted`
// callback (a signal to loom-run) is honoured quickly. A node that never arrives makes join()
// throw TimeoutError naming the missing node ranks; a node whose heartbeat stops for the node
// timeout ends the generation with a message naming it. Not thread-safe; one per loom-run.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/store/store.h"

namespace loom::run {

struct RendezvousOptions {
  std::string runId = "default";
  int nnodes = 1;
  int nodeRank = 0;
  int nprocPerNode = 1;
  int maxRestarts = 0;
  std::string hostname;
  std::string endpoint;  // "addr:port" of the store, for messages
  milliseconds rdzvTimeout{60000};
  milliseconds nodeTimeout{30000};
};

struct World {
  int generation = 0;
  int worldSize = 0;
  int rankOffset = 0;  // global rank of this node's local rank 0
  int workerPort = 0;  // MASTER_PORT for the workers
  std::vector<int> nprocs;
  std::vector<std::string> hosts;
};

class Rendezvous {
 public:
  Rendezvous(
      Store& store, RendezvousOptions options,
      std::function<bool()> interrupted = [] { return false; });

  // Joins generation `gen`: publishes this node, waits for every node (TimeoutError naming the
  // missing ones), checks that the nodes agree on --max-restarts, and reads the worker port
  // that node 0 picks with pickWorkerPort().
  World join(int gen, const std::function<int()>& pickWorkerPort);

  // Adopts a world agreed elsewhere (the elastic rendezvous): generation `gen` with `nnodes`
  // nodes, this one `nodeRank`; poll(), markEnded(), markDone() and ackEnd() then work on it.
  void enter(int gen, int nnodes, int nodeRank);

  // From the monitor loop while the workers run: bumps our heartbeat, returns why the
  // generation ended when another node said so or a node's heartbeat stopped.
  std::optional<std::string> poll();

  // Records why this generation ended unless another node did first; returns the reason that
  // stands (ours or the earlier one).
  std::string markEnded(const std::string& why);
  void markDone();
  void ackEnd();

  // The nodes of generation `gen` (of `nnodes`, other than `me`) that neither finished nor
  // acknowledged its end. Does not wait.
  std::vector<int> unanswered(int gen, int nnodes, int me);

  // Node 0 hosts the store, so it stays until every other node has finished (done) or seen
  // the end (ack), at most `timeout`.
  struct Others {
    std::vector<int> gaveUp;           // nodes that neither finished nor acknowledged in time
    std::optional<std::string> ended;  // why the generation ended, if it did (a failure)
  };
  Others waitForOthers(milliseconds timeout);

  int generation() const { return gen_; }

 private:
  std::string key(const std::string& name) const;
  std::string keyAt(int gen, const std::string& name) const;
  std::string nodeKey(const std::string& name, int node) const;
  // Waits for the keys in slices, honouring interrupted(); true when all exist.
  bool waitSliced(const std::vector<std::string>& keys, const Deadline& deadline);
  // A node (not done) whose heartbeat has not moved for the node timeout, and for how long.
  std::optional<std::pair<int, milliseconds>> silentNode();

  Store& store_;
  RendezvousOptions options_;
  std::function<bool()> interrupted_;
  int gen_ = -1;
  struct Beat {
    int64_t value = -1;
    Clock::time_point changed;
  };
  std::map<int, Beat> beats_;
  std::map<int, bool> done_;
};

// Thrown when loom-run is signalled during a rendezvous wait.
struct RendezvousInterrupted {};

// A number another node (or the store itself) wrote under `key`: an InvalidArgumentError naming
// the key and quoting the value when it is not a whole base-10 integer in [lo, hi] (a corrupt
// store, or another program's keys under the run's prefix).
int64_t storedNumber(const std::string& key, const std::string& text, int64_t lo, int64_t hi);

// What a node may say about itself (--nproc-per-node's range) and the largest world.
constexpr int64_t kMaxStoredNproc = 4096;
constexpr int64_t kMaxWorldSize = 1 << 24;

}  // namespace loom::run
