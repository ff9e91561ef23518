// loom-run: starts a job's workers on this node, like torchrun. See launch_options.cc for the
// flags, worker_group.h for failure handling, rendezvous.h for multi-node agreement and
// docs/launcher.md for the user's view.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <set>

#include "elastic_rendezvous.h"
#include "launch_options.h"
#include "loom/common/error.h"
#include "loom/common/interfaces.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/store/tcp_store.h"
#include "loom/store/tcp_store_server.h"
#include "output.h"
#include "rendezvous.h"
#include "rendezvous_store.h"
#include "shepherd.h"
#include "worker_group.h"

namespace loom::run {
namespace {

constexpr int kLauncherError = 1;

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// The worker's environment: ours, minus the variables loom-run sets, plus them.
std::vector<std::string> workerEnv(const std::vector<std::pair<std::string, std::string>>& set) {
  std::set<std::string> names;
  for (const auto& [name, value] : set) names.insert(name);
  std::vector<std::string> env;
  for (std::string& entry : settings::inherited()) {
    const std::string name = entry.substr(0, entry.find('='));
    if (!names.count(name)) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

std::vector<WorkerSpec> workerSpecs(const LaunchOptions& o, const World& world,
                                    const std::string& masterAddr, int restart,
                                    const std::string& loomHost, int nodeRank, int nnodes) {
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < o.nprocPerNode; ++local) {
    WorkerSpec spec;
    spec.localRank = local;
    spec.rank = world.rankOffset + local;
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", std::to_string(spec.rank)},
        {"WORLD_SIZE", std::to_string(world.worldSize)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(o.nprocPerNode)},
        {"NODE_RANK", std::to_string(nodeRank)},
        {"GROUP_RANK", std::to_string(nodeRank)},
        {"GROUP_WORLD_SIZE", std::to_string(nnodes)},
        {"MASTER_ADDR", masterAddr},
        {"MASTER_PORT", std::to_string(world.workerPort)},
        {"LOOM_RUN_ID", o.runId},
        {"LOOM_RESTART_COUNT", std::to_string(restart)},
        {"LOOM_MAX_RESTARTS", std::to_string(o.maxRestarts)},
        {"LOOM_RUN_ON_WORKER_FAILURE",
         o.onWorkerFailure == LaunchOptions::OnWorkerFailure::kContinue ? "continue" : "stop"},
    };
    // With continue, loom-run hosts the workers' store (runSingleNode): no rank owns it.
    if (o.onWorkerFailure == LaunchOptions::OnWorkerFailure::kContinue) {
      vars.emplace_back("LOOM_AGENT_STORE", "1");
    }
    if (!loomHost.empty()) vars.emplace_back("LOOM_HOST", loomHost);
    spec.env = workerEnv(vars);
    specs.push_back(std::move(spec));
  }
  return specs;
}

class Launcher {
 public:
  Launcher(SignalWatcher& signals, LaunchOptions options, std::string path)
      : signals_(signals), o_(std::move(options)), path_(std::move(path)) {}

  int run() {
    if (o_.elastic) {
      setReportPrefix("loom-run[elastic]: ");
      return runElastic();
    }
    if (o_.nnodes > 1) {
      setReportPrefix("loom-run[node " + std::to_string(o_.nodeRank) + "]: ");
      return runMultiNode();
    }
    return runSingleNode();
  }

 private:
  // True (and remembered) once SIGINT/SIGTERM/SIGHUP reached loom-run outside run().
  bool interrupted() {
    for (int sig : signals_.drain()) {
      if (sig != SIGCHLD && signal_ == 0) signal_ = sig;
    }
    return signal_ != 0;
  }

  GroupResult runGroup(const World& world, int restart, const WorkerGroup::Tick& tick) {
    return runGroupAt(world, o_.masterAddr, restart, o_.nodeRank, o_.nnodes, tick);
  }

  GroupResult runGroupAt(const World& world, const std::string& masterAddr, int restart,
                         int nodeRank, int nnodes, const WorkerGroup::Tick& tick) {
    WorkerGroup group(signals_, {path_, o_.command, o_.redirectPrefix, o_.gracePeriod,
                                 o_.onWorkerFailure == LaunchOptions::OnWorkerFailure::kContinue});
    group.start(workerSpecs(o_, world, masterAddr, restart, loomHost_, nodeRank, nnodes));
    return group.run(tick);
  }

  static std::string failureText(const WorkerExit& e) {
    return "rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.localRank) + ") " +
           e.describe();
  }

  int runSingleNode() {
    World world;
    world.worldSize = o_.nprocPerNode;
    for (int restart = 0;; ++restart) {
      if (interrupted()) return 128 + signal_;
      // With --on-worker-failure continue the survivors of any rank, rank 0 included, must keep
      // their store: loom-run hosts it (a fresh one per attempt, so no keys of a failed attempt
      // remain), and the workers connect to it as clients (LOOM_AGENT_STORE).
      std::unique_ptr<TCPStoreServer> agentStore;
      if (o_.onWorkerFailure == LaunchOptions::OnWorkerFailure::kContinue) {
        TCPStoreServerOptions so;
        so.host = o_.masterAddr;
        so.port = o_.masterPort;
        so.numWorkers = world.worldSize;
        agentStore = std::make_unique<TCPStoreServer>(so);
        world.workerPort = agentStore->port();
      } else {
        world.workerPort = o_.masterPort != 0 ? o_.masterPort : pickFreePort();
      }
      const GroupResult r = runGroup(world, restart, {});
      switch (r.kind) {
        case GroupResult::kSucceeded:
          return 0;
        case GroupResult::kSignalled:
          report("stopped by " + signalName(r.signal));
          return 128 + r.signal;
        case GroupResult::kStopRequested:
          report("stopped: " + r.stopReason);
          return kLauncherError;
        case GroupResult::kWorkerFailed:
          break;
      }
      const std::string why = failureText(*r.firstFailure);
      if (restart < o_.maxRestarts) {
        report("restart " + std::to_string(restart + 1) + " of " + std::to_string(o_.maxRestarts) +
               " after: " + why);
        continue;
      }
      report("job failed: " + why + (o_.maxRestarts ? " (no restarts left)" : ""));
      return r.firstFailure->exitCode();
    }
  }

  int runMultiNode() {
    // The workers' transports listen on this node's address towards node 0 (or on the
    // interface LOOM_SOCKET_IFNAME selects), unless the user chose one (LOOM_HOST).
    if (!settings::text("LOOM_HOST")) loomHost_ = net::defaultListenAddress(o_.masterAddr);
    std::unique_ptr<RendezvousStore> rs = openRendezvousStore(o_);
    RendezvousOptions ro;
    ro.runId = o_.runId;
    ro.nnodes = o_.nnodes;
    ro.nodeRank = o_.nodeRank;
    ro.nprocPerNode = o_.nprocPerNode;
    ro.maxRestarts = o_.maxRestarts;
    ro.hostname = hostName();
    ro.endpoint = rs->endpoint();
    ro.rdzvTimeout = o_.rdzvTimeout;
    ro.nodeTimeout = o_.nodeTimeout;
    Rendezvous rdzv(rs->store(), ro, [this] { return interrupted(); });
    const bool host = o_.nodeRank == 0;
    // Node 0 hosts the store: before it leaves, let the others learn how the job ended.
    // Returns why the job failed elsewhere, if it did.
    auto lingerIfHost = [&]() -> std::optional<std::string> {
      if (!host) return std::nullopt;
      const auto others = rdzv.waitForOthers(o_.nodeTimeout);
      for (int n : others.gaveUp) report("node " + std::to_string(n) + " did not report back");
      return others.ended;
    };

    for (int restart = 0;; ++restart) {
      World world;
      try {
        world = rdzv.join(restart, pickFreePort);
      } catch (const RendezvousInterrupted&) {
        report("stopped by " + signalName(signal_) + " during the rendezvous");
        return 128 + signal_;
      }
      report("generation " + std::to_string(restart) + ": world size " +
             std::to_string(world.worldSize) + ", ranks " + std::to_string(world.rankOffset) +
             ".." + std::to_string(world.rankOffset + o_.nprocPerNode - 1) +
             " on this node, workers' MASTER_PORT " + std::to_string(world.workerPort));
      // Losing the store (node 0 died, or the network to it) ends the job on this node: there
      // is no one left to agree with on a restart.
      std::optional<std::string> storeLost;
      const GroupResult r = runGroup(world, restart, [&]() -> std::optional<std::string> {
        try {
          return rdzv.poll();
        } catch (const IoError& e) {
          storeLost = "lost the rendezvous store at " + rs->endpoint() +
                      " (node 0's loom-run died, or the network to it failed): " + e.what();
          return storeLost;
        }
      });
      if (storeLost) {
        report("job failed: " + *storeLost);
        return kLauncherError;
      }
      // After the workers ended, the store may still vanish under us (node 0 leaving first):
      // then this node reports what it knows and stops.
      auto tryStore = [&](const char* what, const auto& fn) {
        try {
          fn();
          return true;
        } catch (const IoError& e) {
          report(std::string("could not ") + what + " through the store at " + rs->endpoint() +
                 ": " + e.what());
          return false;
        } catch (const RendezvousInterrupted&) {
          return false;
        }
      };
      std::string why;
      int code = kLauncherError;
      switch (r.kind) {
        case GroupResult::kSucceeded: {
          std::optional<std::string> failed;
          tryStore("report success", [&] {
            rdzv.markDone();
            failed = lingerIfHost();
          });
          // Node 0 outlives the others, so its exit code speaks for the whole job.
          if (failed) {
            report("this node's workers succeeded, but the job failed: " + *failed);
            return kLauncherError;
          }
          return 0;
        }
        case GroupResult::kSignalled:
          report("stopped by " + signalName(r.signal));
          tryStore("report the stop", [&] {
            rdzv.markEnded("node " + std::to_string(o_.nodeRank) + ": loom-run got " +
                           signalName(r.signal));
            rdzv.ackEnd();
            lingerIfHost();
          });
          return 128 + r.signal;
        case GroupResult::kStopRequested:
          why = r.stopReason;
          if (!tryStore("acknowledge the end", [&] { rdzv.ackEnd(); })) {
            report("job failed: " + why);
            return kLauncherError;
          }
          break;
        case GroupResult::kWorkerFailed:
          why = "node " + std::to_string(o_.nodeRank) + ": " + failureText(*r.firstFailure);
          code = r.firstFailure->exitCode();
          if (!tryStore("report the failure", [&] {
                why = rdzv.markEnded(why);
                rdzv.ackEnd();
              })) {
            report("job failed: " + why);
            return code;
          }
          break;
      }
      if (restart < o_.maxRestarts) {
        report("restart " + std::to_string(restart + 1) + " of " + std::to_string(o_.maxRestarts) +
               " after: " + why);
        continue;
      }
      report("job failed: " + why + (o_.maxRestarts ? " (no restarts left)" : ""));
      tryStore("wait for the other nodes", [&] { lingerIfHost(); });
      return code;
    }
  }

  // --nnodes MIN:MAX (elastic_rendezvous.h). Every round: join (as node i of n), run the
  // workers with that world until they finish or the round ends (a node's failure, a silent
  // node, a newcomer waiting), then join the next round. This node leaves the job when its own
  // workers failed more than --max-restarts times (it is charged only when its failure was the
  // one that ended the round and every other node of that round answered, not for a cascade
  // from a node that died).
  int runElastic() {
    const std::string endpoint = o_.rdzvHost + ":" + std::to_string(o_.rdzvPort);
    // This node's address for its peers (node 0's becomes the workers' MASTER_ADDR): the
    // user's LOOM_HOST, else LOOM_SOCKET_IFNAME's interface, else the local address on the
    // route to the store.
    std::string address;
    if (auto chosen = settings::text("LOOM_HOST")) {
      address = *chosen;
    } else {
      address = net::defaultListenAddress(o_.rdzvHost);
      loomHost_ = address;
    }
    TCPStoreOptions so;
    so.timeout = o_.rdzvTimeout;
    // The store is a loom-store that may restart (--data-dir): ride through that.
    so.reconnectTimeout = o_.rdzvTimeout;
    std::unique_ptr<TCPStore> store;
    try {
      store = std::make_unique<TCPStore>(o_.rdzvHost, o_.rdzvPort, so);
    } catch (const IoError& e) {
      report(std::string("cannot reach the rendezvous store at ") + endpoint +
             " (--rdzv-endpoint; is loom-store running there?): " + e.what());
      return kLauncherError;
    }
    ElasticOptions eo;
    eo.runId = o_.runId;
    eo.minNodes = o_.minNodes;
    eo.maxNodes = o_.maxNodes;
    eo.nprocPerNode = o_.nprocPerNode;
    eo.hostname = hostName();
    eo.address = address;
    eo.endpoint = endpoint;
    eo.rdzvTimeout = o_.rdzvTimeout;
    eo.lastCall = o_.lastCall;
    ElasticRendezvous elastic(*store, eo, [this] { return interrupted(); });
    RendezvousOptions ro;
    ro.runId = o_.runId;
    ro.nprocPerNode = o_.nprocPerNode;
    ro.maxRestarts = o_.maxRestarts;
    ro.hostname = eo.hostname;
    ro.endpoint = endpoint;
    ro.rdzvTimeout = o_.rdzvTimeout;
    ro.nodeTimeout = o_.nodeTimeout;
    Rendezvous rdzv(*store, ro, [this] { return interrupted(); });

    int failures = 0;
    // A failure of this node's workers that ended round `gen`, not yet charged.
    struct PendingCharge {
      bool pending = false;
      int gen = 0;
      int nnodes = 0;
      int nodeRank = 0;
    } pendingCharge;
    int lastFailureCode = 1;
    int gen = 0;
    try {
      gen = elastic.currentRound();
    } catch (const IoError& e) {
      report(std::string("rendezvous store at ") + endpoint + ": " + e.what());
      return kLauncherError;
    }
    for (;;) {
      ElasticWorld ew;
      try {
        ew = elastic.join(gen, pickFreePort);
      } catch (const RendezvousInterrupted&) {
        report("stopped by " + signalName(signal_) + " during the rendezvous");
        return 128 + signal_;
      } catch (const IoError& e) {
        report(std::string("job failed: ") + e.what());
        return kLauncherError;
      }
      gen = ew.generation;
      setReportPrefix("loom-run[elastic node " + std::to_string(ew.nodeRank) + "]: ");
      rdzv.enter(gen, ew.nnodes, ew.nodeRank);
      if (pendingCharge.pending) {
        // Our failure ended the previous round. It counts against this node unless a node of
        // that round never acknowledged the end: then our workers most likely failed because
        // that node died (their peers went away), which is its failure, not ours. Live nodes
        // acknowledge before they join a round, so by now they have.
        std::vector<int> silent;
        try {
          silent = rdzv.unanswered(pendingCharge.gen, pendingCharge.nnodes, pendingCharge.nodeRank);
        } catch (const IoError& e) {
          report(std::string("job failed: the rendezvous store at ") + endpoint + ": " + e.what());
          return kLauncherError;
        }
        if (silent.empty()) {
          ++failures;
        } else {
          std::string gone;
          for (int n : silent) gone += (gone.empty() ? "" : ", ") + std::to_string(n);
          report("the failure in round " + std::to_string(pendingCharge.gen) +
                 " is not counted against this node: node(s) " + gone +
                 " of that round never acknowledged its end (the failure most likely came "
                 "from there)");
        }
        pendingCharge.pending = false;
        if (failures > o_.maxRestarts) {
          const std::string why = "node " + std::to_string(ew.nodeRank) + " (" + eo.hostname +
                                  ") leaves the job: its workers failed " +
                                  std::to_string(failures) + " time(s), more than --max-restarts " +
                                  std::to_string(o_.maxRestarts);
          report(why);
          try {
            rdzv.markEnded(why);
            rdzv.ackEnd();
          } catch (const IoError&) {
            // The others find this node silent instead.
          }
          return lastFailureCode;
        }
      }
      World world;
      world.generation = gen;
      world.worldSize = ew.worldSize;
      world.rankOffset = ew.rankOffset;
      world.workerPort = ew.workerPort;
      report("round " + std::to_string(gen) + ": " + std::to_string(ew.nnodes) + " node(s) (" +
             std::to_string(o_.minNodes) + ":" + std::to_string(o_.maxNodes) + "), world size " +
             std::to_string(ew.worldSize) + ", ranks " + std::to_string(ew.rankOffset) + ".." +
             std::to_string(ew.rankOffset + o_.nprocPerNode - 1) + " on this node");
      // A store call that fails is retried on the next tick; only a store that stays away for
      // the node timeout ends the job here.
      std::optional<std::string> storeLost;
      std::optional<Clock::time_point> failingSince;
      const GroupResult r = runGroupAt(
          world, ew.masterAddr, gen, ew.nodeRank, ew.nnodes, [&]() -> std::optional<std::string> {
            try {
              auto why = rdzv.poll();
              if (!why) why = elastic.newcomers(gen, ew.nnodes);
              failingSince.reset();
              return why;
            } catch (const IoError& e) {
              if (!failingSince) failingSince = Clock::now();
              if (Clock::now() - *failingSince < o_.nodeTimeout) return std::nullopt;
              storeLost = "lost the rendezvous store at " + endpoint + ": " + e.what();
              return storeLost;
            }
          });
      if (storeLost) {
        report("job failed: " + *storeLost);
        return kLauncherError;
      }
      try {
        switch (r.kind) {
          case GroupResult::kSucceeded:
            rdzv.markDone();
            return 0;
          case GroupResult::kSignalled:
            report("stopped by " + signalName(r.signal));
            rdzv.markEnded("node " + std::to_string(ew.nodeRank) + " (" + eo.hostname +
                           "): loom-run got " + signalName(r.signal) + " and left the job");
            rdzv.ackEnd();
            return 128 + r.signal;
          case GroupResult::kStopRequested:
            report("round " + std::to_string(gen) + " ended: " + r.stopReason);
            rdzv.ackEnd();
            break;
          case GroupResult::kWorkerFailed: {
            const std::string why = "node " + std::to_string(ew.nodeRank) + " (" + eo.hostname +
                                    "): " + failureText(*r.firstFailure);
            const std::string standing = rdzv.markEnded(why);
            rdzv.ackEnd();
            report("round " + std::to_string(gen) + " ended: " + standing);
            // Charged or not is decided once the next round has formed (below), when every
            // live node of this one has acknowledged the end; waiting for that here would
            // delay the next round.
            if (standing == why) {
              pendingCharge = PendingCharge{true, gen, ew.nnodes, ew.nodeRank};
              lastFailureCode = r.firstFailure->exitCode();
            }
            break;
          }
        }
        elastic.advance(gen);
      } catch (const IoError& e) {
        report(std::string("job failed: the rendezvous store at ") + endpoint + ": " + e.what());
        return kLauncherError;
      } catch (const RendezvousInterrupted&) {
        report("stopped by " + signalName(signal_) + " between rounds");
        return 128 + signal_;
      }
      ++gen;
    }
  }

  SignalWatcher& signals_;
  LaunchOptions o_;
  std::string path_;
  std::string loomHost_;  // LOOM_HOST for the workers; "" = leave the environment's
  int signal_ = 0;
};

}  // namespace
}  // namespace loom::run

namespace {

// Writes out what is still queued (output.h) before loom-run exits: as long as the reader takes
// it, like any program, but a signal to loom-run ends the wait.
int exitWith(loom::run::SignalWatcher& signals, int code) {
  loom::run::output::flush([&] {
    for (int sig : signals.drain()) {
      if (sig != SIGCHLD) return true;
    }
    return false;
  });
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::run;
  // First, before any thread exists: route SIGINT/SIGTERM/SIGHUP/SIGCHLD to a signalfd.
  std::unique_ptr<SignalWatcher> signals;
  try {
    signals = std::make_unique<SignalWatcher>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-run: %s\n", e.what());
    return 1;
  }
  const ParseOutcome parsed = parseLaunchOptions(argc, argv);
  if (parsed.kind == ParseOutcome::kHelp) {
    std::cout << parsed.text;
    return 0;
  }
  if (parsed.kind == ParseOutcome::kUsageError) {
    std::cerr << parsed.text << "\n";
    return 2;
  }
  const LaunchOptions& o = parsed.options;
  for (const auto& note : parsed.unused) report("note: " + note);
  const std::string path = resolveProgram(o.command.front());
  if (path.empty()) {
    const std::string envPath = loom::settings::text("PATH").value_or("");
    report("PROGRAM '" + o.command.front() + "' not found: " +
           (o.command.front().find('/') != std::string::npos
                ? std::string("no executable file at that path")
                : "no executable of that name in PATH=" + envPath));
    return exitWith(*signals, 127);
  }
  int code = 1;
  try {
    code = Launcher(*signals, o, path).run();
  } catch (const std::exception& e) {
    report(std::string("error: ") + e.what());
  }
  return exitWith(*signals, code);
}
