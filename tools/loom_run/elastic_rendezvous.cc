#include "elastic_rendezvous.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "loom/common/error.h"
#include "rendezvous.h"

namespace loom::run {
namespace {

constexpr milliseconds kSlice{200};
// How long the admitted nodes' keys may take to appear after a round closed.
constexpr milliseconds kNodeKeyWait{10000};

std::map<std::string, std::string> parseFields(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string field;
  while (std::getline(in, field, ';')) {
    const auto eq = field.find('=');
    if (eq != std::string::npos) out[field.substr(0, eq)] = field.substr(eq + 1);
  }
  return out;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(Store& store, ElasticOptions options,
                                     std::function<bool()> interrupted)
    : store_(store), options_(std::move(options)), interrupted_(std::move(interrupted)) {
  LOOM_CHECK(options_.minNodes >= 1 && options_.minNodes <= options_.maxNodes,
             "elastic rendezvous: need 1 <= MIN <= MAX, got ", options_.minNodes, ":",
             options_.maxNodes);
}

std::string ElasticRendezvous::key(int gen, const std::string& name) const {
  return "loom-run/" + options_.runId + "/g" + std::to_string(gen) + "/" + name;
}

int64_t ElasticRendezvous::readInt(const std::string& k) {
  if (!store_.check({k})) return 0;
  return storedNumber(k, store_.getString(k), 0, INT32_MAX);
}

int ElasticRendezvous::currentRound() {
  const std::string k = "loom-run/" + options_.runId + "/round";
  return static_cast<int>(
      storedNumber(k, toString(store_.compareSet(k, {}, toBytes("0"))), 0, INT32_MAX));
}

void ElasticRendezvous::advance(int gen) {
  const std::string k = "loom-run/" + options_.runId + "/round";
  store_.compareSet(k, toBytes(std::to_string(gen)), toBytes(std::to_string(gen + 1)));
}

int64_t ElasticRendezvous::awaitClose(int gen, const Deadline& deadline) {
  const std::string closedKey = key(gen, "closed");
  const std::string arrivalsKey = key(gen, "arrivals");
  int64_t seen = -1;
  auto lastChange = Clock::now();
  for (;;) {
    // The round admits at most MAX agents (every agent runs with the same --nnodes).
    if (store_.check({closedKey})) {
      return storedNumber(closedKey, store_.getString(closedKey), 0, options_.maxNodes);
    }
    const int64_t arrived = readInt(arrivalsKey);
    if (arrived != seen) {
      seen = arrived;
      lastChange = Clock::now();
    }
    const bool full = arrived >= options_.maxNodes;
    const bool quiet =
        arrived >= options_.minNodes && Clock::now() - lastChange >= options_.lastCall;
    if (full || quiet) {
      const int64_t admit = std::min<int64_t>(arrived, options_.maxNodes);
      return storedNumber(
          closedKey, toString(store_.compareSet(closedKey, {}, toBytes(std::to_string(admit)))), 0,
          options_.maxNodes);
    }
    if (interrupted_()) throw RendezvousInterrupted{};
    if (deadline.expired()) {
      LOOM_THROW(TimeoutError, "elastic rendezvous of run '", options_.runId, "' round ", gen,
                 " at ", options_.endpoint, ": only ", arrived, " node(s) arrived within ",
                 deadline.elapsed().count(), " ms; the job needs at least ", options_.minNodes,
                 " (--nnodes ", options_.minNodes, ":", options_.maxNodes, ")");
    }
    try {
      store_.wait({closedKey}, std::min(kSlice, deadline.remaining()));
    } catch (const TimeoutError&) {
    }
  }
}

ElasticWorld ElasticRendezvous::join(int gen, const std::function<int()>& pickWorkerPort) {
  const Deadline deadline(options_.rdzvTimeout);
  for (;;) {
    const int64_t me = store_.add(key(gen, "arrivals"), 1) - 1;
    store_.set(key(gen, "node/" + std::to_string(me)),
               "nproc=" + std::to_string(options_.nprocPerNode) + ";host=" + options_.hostname +
                   ";addr=" + options_.address);
    const int64_t closed = awaitClose(gen, deadline);
    if (me < closed) {
      ElasticWorld world;
      world.generation = gen;
      world.nnodes = static_cast<int>(closed);
      world.nodeRank = static_cast<int>(me);
      if (me == 0) store_.set(key(gen, "worker_port"), std::to_string(pickWorkerPort()));
      std::vector<std::string> keys;
      for (int64_t n = 0; n < closed; ++n) keys.push_back(key(gen, "node/" + std::to_string(n)));
      keys.push_back(key(gen, "worker_port"));
      // Every admitted node writes its key right after arriving. One that died in between (or
      // whose arrival was counted but never answered: a store restart under its add) leaves
      // the round unable to run: every node sees the same missing key and they all move on to
      // the next round.
      try {
        store_.wait(keys, std::clamp(deadline.remaining(), milliseconds(1000), kNodeKeyWait));
      } catch (const TimeoutError&) {
        if (deadline.expired()) throw;
        advance(gen);
        ++gen;
        continue;
      }
      for (int64_t n = 0; n < closed; ++n) {
        const std::string& k = keys[static_cast<size_t>(n)];
        auto fields = parseFields(store_.getString(k));
        const int nproc =
            static_cast<int>(storedNumber(k + " nproc", fields["nproc"], 1, kMaxStoredNproc));
        if (n < me) world.rankOffset += nproc;
        world.worldSize += nproc;
        LOOM_CHECK(world.worldSize <= kMaxWorldSize, "elastic rendezvous of run '", options_.runId,
                   "': the nodes' processes add up to more than ", kMaxWorldSize);
        world.hosts.push_back(fields["host"]);
        if (n == 0) world.masterAddr = fields["addr"];
      }
      const std::string portKey = key(gen, "worker_port");
      world.workerPort =
          static_cast<int>(storedNumber(portKey, store_.getString(portKey), 1, 65535));
      return world;
    }
    // Late for round `gen`: its nodes see this arrival and start the next round when there is
    // room (newcomers()); wait for it.
    const std::string roundKey = "loom-run/" + options_.runId + "/round";
    for (;;) {
      const int round = static_cast<int>(readInt(roundKey));
      if (round > gen) {
        gen = round;
        break;
      }
      if (interrupted_()) throw RendezvousInterrupted{};
      if (deadline.expired()) {
        LOOM_THROW(TimeoutError, "elastic rendezvous of run '", options_.runId,
                   "': this node arrived after round ", gen, " closed with ", closed,
                   " node(s) and no new round started within ", deadline.elapsed().count(), " ms",
                   closed >= options_.maxNodes ? " (the job is at --nnodes MAX)" : "");
      }
      std::this_thread::sleep_for(std::min(kSlice, deadline.remaining()));
    }
  }
}

std::optional<std::string> ElasticRendezvous::newcomers(int gen, int nnodes) {
  if (nnodes >= options_.maxNodes) return std::nullopt;
  const int64_t arrived = readInt(key(gen, "arrivals"));
  if (arrived <= nnodes) return std::nullopt;
  return "node(s) waiting to join (" + std::to_string(arrived - nnodes) + " arrived after round " +
         std::to_string(gen) + " started with " + std::to_string(nnodes) + " of at most " +
         std::to_string(options_.maxNodes) + " nodes): starting a new round";
}

}  // namespace loom::run
