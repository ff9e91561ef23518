#include "rendezvous.h"

#include <algorithm>
#include <sstream>

#include "loom/common/env.h"
#include "loom/common/error.h"

namespace loom::run {
namespace {

constexpr milliseconds kSlice{200};
constexpr milliseconds kVerdictGrace{2000};

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

std::string joinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

}  // namespace

int64_t storedNumber(const std::string& key, const std::string& text, int64_t lo, int64_t hi) {
  return env::parseInteger(("rendezvous value " + key).c_str(), text, lo, hi);
}

Rendezvous::Rendezvous(Store& store, RendezvousOptions options, std::function<bool()> interrupted)
    : store_(store), options_(std::move(options)), interrupted_(std::move(interrupted)) {
  LOOM_CHECK(options_.nnodes >= 1 && options_.nodeRank >= 0 && options_.nodeRank < options_.nnodes,
             "node rank ", options_.nodeRank, " out of range for ", options_.nnodes, " nodes");
}

std::string Rendezvous::key(const std::string& name) const {
  return keyAt(gen_, name);
}

std::string Rendezvous::keyAt(int gen, const std::string& name) const {
  return "loom-run/" + options_.runId + "/g" + std::to_string(gen) + "/" + name;
}

std::string Rendezvous::nodeKey(const std::string& name, int node) const {
  return key(name + "/" + std::to_string(node));
}

bool Rendezvous::waitSliced(const std::vector<std::string>& keys, const Deadline& deadline) {
  for (;;) {
    if (store_.check(keys)) return true;
    if (interrupted_()) throw RendezvousInterrupted{};
    if (deadline.expired()) return false;
    try {
      store_.wait(keys, std::min(kSlice, deadline.remaining()));
    } catch (const TimeoutError&) {
    }
  }
}

World Rendezvous::join(int gen, const std::function<int()>& pickWorkerPort) {
  gen_ = gen;
  beats_.clear();
  done_.clear();
  const int me = options_.nodeRank;
  // The others allow node 0 a moment more, so that its verdict (below) reaches them.
  const Deadline deadline(options_.rdzvTimeout + (me == 0 ? milliseconds(0) : kVerdictGrace));
  store_.set(nodeKey("node", me), "nproc=" + std::to_string(options_.nprocPerNode) +
                                      ";restarts=" + std::to_string(options_.maxRestarts) +
                                      ";host=" + options_.hostname);
  if (me == 0) store_.set(key("worker_port"), std::to_string(pickWorkerPort()));

  std::vector<std::string> keys;
  for (int n = 0; n < options_.nnodes; ++n) keys.push_back(nodeKey("node", n));
  keys.push_back(key("worker_port"));
  // Node 0 gives up first (it hosts the store, and closing it would leave the others with a
  // bare "connection closed"), so it posts its verdict here and the others repeat it.
  const std::string verdict = key("rdzv_error");
  for (;;) {
    if (store_.check(keys)) break;
    if (me != 0 && store_.check({verdict})) {
      const std::string why = store_.getString(verdict);
      store_.set(nodeKey("rdzv_error_ack", me), "1");
      LOOM_THROW(TimeoutError, why, " (as reported by node 0)");
    }
    if (interrupted_()) throw RendezvousInterrupted{};
    if (deadline.expired()) {
      std::vector<int> missing, arrived;
      for (int n = 0; n < options_.nnodes; ++n) {
        (store_.check({nodeKey("node", n)}) ? arrived : missing).push_back(n);
      }
      const std::string why = detail::str(
          "rendezvous of run '", options_.runId, "' generation ", gen, " at ", options_.endpoint,
          " timed out after ", deadline.elapsed().count(), " ms: node(s) ", joinInts(missing),
          " of ", options_.nnodes,
          " never arrived (arrived: ", arrived.empty() ? "none" : joinInts(arrived), ")");
      if (me == 0) {
        store_.set(verdict, why);
        std::vector<std::string> acks;
        for (int n : arrived) {
          if (n != 0) acks.push_back(nodeKey("rdzv_error_ack", n));
        }
        waitSliced(acks, Deadline(kVerdictGrace + kSlice));
      } else {
        store_.set(nodeKey("rdzv_error_ack", me), "1");
      }
      LOOM_THROW(TimeoutError, why);
    }
    try {
      store_.wait(keys, std::min(kSlice, deadline.remaining()));
    } catch (const TimeoutError&) {
    }
  }

  World world;
  world.generation = gen;
  for (int n = 0; n < options_.nnodes; ++n) {
    const std::string k = nodeKey("node", n);
    auto fields = parseFields(store_.getString(k));
    const int nproc =
        static_cast<int>(storedNumber(k + " nproc", fields["nproc"], 1, kMaxStoredNproc));
    const int restarts =
        static_cast<int>(storedNumber(k + " restarts", fields["restarts"], 0, INT32_MAX));
    LOOM_CHECK(restarts == options_.maxRestarts, "node ", n, " (", fields["host"],
               ") runs with --max-restarts ", restarts, " but node ", me, " with ",
               options_.maxRestarts, ": every node must pass the same value");
    if (n < me) world.rankOffset += nproc;
    world.worldSize += nproc;
    LOOM_CHECK(world.worldSize <= kMaxWorldSize, "rendezvous of run '", options_.runId,
               "': the nodes' processes add up to more than ", kMaxWorldSize);
    world.nprocs.push_back(nproc);
    world.hosts.push_back(fields["host"]);
  }
  world.workerPort = static_cast<int>(
      storedNumber(key("worker_port"), store_.getString(key("worker_port")), 1, 65535));
  const auto now = Clock::now();
  for (int n = 0; n < options_.nnodes; ++n) {
    if (n != me) beats_[n] = Beat{-1, now};
  }
  return world;
}

void Rendezvous::enter(int gen, int nnodes, int nodeRank) {
  LOOM_CHECK(nnodes >= 1 && nodeRank >= 0 && nodeRank < nnodes, "node rank ", nodeRank,
             " out of range for ", nnodes, " nodes");
  gen_ = gen;
  options_.nnodes = nnodes;
  options_.nodeRank = nodeRank;
  beats_.clear();
  done_.clear();
  const auto now = Clock::now();
  for (int n = 0; n < nnodes; ++n) {
    if (n != nodeRank) beats_[n] = Beat{-1, now};
  }
}

std::optional<std::pair<int, milliseconds>> Rendezvous::silentNode() {
  const auto now = Clock::now();
  for (auto& [node, beat] : beats_) {
    if (done_[node]) continue;
    if (store_.check({nodeKey("done", node)})) {
      done_[node] = true;
      continue;
    }
    const int64_t value = store_.add(nodeKey("hb", node), 0);
    if (value != beat.value) {
      beat = Beat{value, now};
      continue;
    }
    const auto silent = std::chrono::duration_cast<milliseconds>(now - beat.changed);
    if (silent >= options_.nodeTimeout) return std::make_pair(node, silent);
  }
  return std::nullopt;
}

std::optional<std::string> Rendezvous::poll() {
  store_.add(nodeKey("hb", options_.nodeRank), 1);
  if (store_.check({key("end")})) return store_.getString(key("end"));
  if (auto silent = silentNode()) {
    return markEnded("node " + std::to_string(silent->first) + " sent no heartbeat for " +
                     std::to_string(silent->second.count()) +
                     " ms (its loom-run died or the network to it failed)");
  }
  return std::nullopt;
}

std::string Rendezvous::markEnded(const std::string& why) {
  const Bytes current = store_.compareSet(key("end"), {}, toBytes(why));
  return toString(current);
}

void Rendezvous::markDone() {
  store_.set(nodeKey("done", options_.nodeRank), "1");
}

void Rendezvous::ackEnd() {
  store_.set(nodeKey("ack", options_.nodeRank), "1");
}

std::vector<int> Rendezvous::unanswered(int gen, int nnodes, int me) {
  std::vector<int> out;
  for (int n = 0; n < nnodes; ++n) {
    if (n == me) continue;
    const std::string node = std::to_string(n);
    if (!store_.check({keyAt(gen, "done/" + node)}) && !store_.check({keyAt(gen, "ack/" + node)})) {
      out.push_back(n);
    }
  }
  return out;
}

Rendezvous::Others Rendezvous::waitForOthers(milliseconds timeout) {
  const Deadline deadline(timeout);
  std::vector<int> pending, gaveUp;
  for (int n = 0; n < options_.nnodes; ++n) {
    if (n != options_.nodeRank) pending.push_back(n);
  }
  while (!pending.empty()) {
    // Keep beating: the others must not take this node for dead while it waits for them.
    store_.add(nodeKey("hb", options_.nodeRank), 1);
    std::vector<int> still;
    for (int n : pending) {
      if (!store_.check({nodeKey("done", n)}) && !store_.check({nodeKey("ack", n)})) {
        still.push_back(n);
      }
    }
    pending.swap(still);
    if (pending.empty() || deadline.expired()) break;
    if (interrupted_()) throw RendezvousInterrupted{};
    // A node whose heartbeat stopped will never answer: don't wait the full timeout for it.
    if (auto silent = silentNode()) {
      done_[silent->first] = true;
      const auto it = std::find(pending.begin(), pending.end(), silent->first);
      if (it != pending.end()) {
        gaveUp.push_back(*it);
        pending.erase(it);
      }
      continue;
    }
    try {
      store_.wait({nodeKey("done", pending.front())}, std::min(kSlice, deadline.remaining()));
    } catch (const TimeoutError&) {
    }
  }
  gaveUp.insert(gaveUp.end(), pending.begin(), pending.end());
  std::sort(gaveUp.begin(), gaveUp.end());
  Others out;
  out.gaveUp = gaveUp;
  if (store_.check({key("end")})) out.ended = store_.getString(key("end"));
  return out;
}

}  // namespace loom::run
