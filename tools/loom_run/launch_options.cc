#include "launch_options.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <sstream>
#include <string>

#include "loom/cli/checks.h"

namespace loom::run {
namespace {

constexpr const char* kUsage =
    "usage: loom-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A "
    "--master-port P | --nnodes MIN:MAX --rdzv-endpoint HOST:PORT] [--max-restarts K] "
    "[--on-worker-failure stop|continue] [--redirect-prefix] [--grace-period-s S] "
    "[--rdzv-timeout-s S] [--node-timeout-s S] [--rdzv-last-call-s S] [--run-id ID] "
    "[--rdzv-endpoint HOST:PORT] [--] "
    "PROGRAM [ARGS...]";

constexpr const char* kDescription =
    "Starts N worker processes of PROGRAM on this node with RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, NODE_RANK (and GROUP_RANK), MASTER_ADDR and MASTER_PORT set, as\n"
    "torchrun does. If a worker exits non-zero or is killed by a signal, the others get\n"
    "SIGTERM, then SIGKILL after the grace period; loom-run names the rank that failed first\n"
    "and exits with its exit code (128+N when it was killed by signal N). SIGINT, SIGTERM and\n"
    "SIGHUP sent to loom-run are forwarded to every worker the same way; loom-run then exits\n"
    "with 128+signal. Workers die with loom-run even when it is SIGKILLed.\n"
    "With --on-worker-failure continue (one node only), a failed worker is reported and the\n"
    "others keep running (for a trainer that shrinks in place: loom-train --shrink-on-failure);\n"
    "loom-run then exits 0 when some worker exited 0 and no worker failed after that.\n"
    "\n"
    "With --nnodes M > 1, start one loom-run per node; node 0 hosts the rendezvous TCPStore\n"
    "at --master-addr:--master-port and all nodes agree on the world before any worker\n"
    "starts. Ranks are numbered node by node. Exit codes: the failing worker's code, 128+N\n"
    "for a signal, 1 for a launcher error (rendezvous, lost node), 2 for a usage error, 127\n"
    "when PROGRAM is not found.\n"
    "\n"
    "With --nnodes MIN:MAX the job is elastic: every loom-run meets at --rdzv-endpoint (a\n"
    "loom-store, ideally with --data-dir); each membership change (a node lost, a node\n"
    "joining) is a new round in which the workers restart with the new world and\n"
    "LOOM_RESTART_COUNT = the round; the job goes on while MIN nodes remain; a node whose\n"
    "own workers failed more than --max-restarts times leaves the job. See docs/launcher.md.";

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0));
}

}  // namespace

ParseOutcome parseLaunchOptions(int argc, const char* const* argv) {
  ParseOutcome out;
  LaunchOptions& o = out.options;
  CLI::App app(kDescription, "loom-run");
  app.prefix_command();
  double grace = 5.0;
  double rdzvTimeout = 60.0;
  double nodeTimeout = 30.0;
  double lastCall = 2.0;

  app.add_option("--nproc-per-node", o.nprocPerNode, "worker processes to start on this node")
      ->check(loom::cli::wholeIn(1, 4096));
  std::string nnodes = "1";
  app.add_option("--nnodes", nnodes,
                 "number of nodes (one loom-run each), or MIN:MAX for an elastic job; default 1");
  app.add_option("--node-rank", o.nodeRank, "this node's index in [0, nnodes); default 0")
      ->check(loom::cli::wholeIn(0, 65535));
  app.add_option("--master-addr", o.masterAddr,
                 "address of node 0, where the rendezvous store runs; default 127.0.0.1");
  app.add_option("--master-port", o.masterPort,
                 "port of the rendezvous store on node 0 (required with --nnodes > 1); "
                 "0 or absent on a single node picks a free port")
      ->check(loom::cli::wholeIn(0, 65535));
  app.add_option("--max-restarts", o.maxRestarts,
                 "restart the worker group up to K times after a failure; default 0")
      ->check(loom::cli::wholeIn(0, 1000000));
  std::string onFailure = "stop";
  app.add_option("--on-worker-failure", onFailure,
                 "stop: stop every worker when one fails (default); continue: report it and let "
                 "the others run on (one node only; for trainers that shrink in place)")
      ->check(CLI::IsMember({"stop", "continue"}));
  app.add_flag("--redirect-prefix", o.redirectPrefix,
               "prefix every line of worker output with '[rank R] '");
  app.add_option("--grace-period-s", grace,
                 "seconds between SIGTERM and SIGKILL when stopping workers; default 5")
      ->check(loom::cli::numberIn(0.0, 3600.0));
  app.add_option("--rdzv-timeout-s", rdzvTimeout,
                 "seconds to wait for every node at a rendezvous; default 60")
      ->check(loom::cli::numberIn(0.1, 86400.0));
  app.add_option("--node-timeout-s", nodeTimeout,
                 "a node whose heartbeat stops for this long fails the job; default 30")
      ->check(loom::cli::numberIn(0.5, 86400.0));
  app.add_option("--rdzv-last-call-s", lastCall,
                 "elastic: once MIN nodes are in a round, close it after this many seconds "
                 "without a new arrival (MAX nodes close it at once); default 2")
      ->check(loom::cli::numberIn(0.0, 3600.0));
  app.add_option("--run-id", o.runId,
                 "job id shared by all nodes, namespaces the rendezvous keys; default "
                 "'default'");

  std::string rdzvEndpoint;
  app.add_option("--rdzv-endpoint", rdzvEndpoint,
                 "HOST:PORT where this node (if not node 0) reaches the rendezvous store, when "
                 "not at --master-addr:--master-port (a proxy, a NAT); workers still get "
                 "MASTER_ADDR=--master-addr");
  app.footer(
      "Environment of every worker: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,\n"
      "GROUP_RANK (= NODE_RANK), GROUP_WORLD_SIZE (= --nnodes), MASTER_ADDR, MASTER_PORT,\n"
      "LOOM_RUN_ID, LOOM_RESTART_COUNT (0, 1, ... per restart), LOOM_MAX_RESTARTS,\n"
      "LOOM_RUN_ON_WORKER_FAILURE (stop or continue). On a single\n"
      "node MASTER_PORT is --master-port, or a free port when it is 0 or absent; with several\n"
      "nodes it is a free port on node 0 picked for each (re)start, because --master-port is\n"
      "taken by loom-run's own rendezvous store. Worker stdin is /dev/null.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out.kind = ParseOutcome::kHelp;
    out.text = std::string(kUsage) + "\n\n" + app.help();
    return out;
  } catch (const CLI::ParseError& e) {
    out.kind = ParseOutcome::kUsageError;
    out.text =
        std::string("loom-run: ") + e.what() + "\n" + kUsage + "\n(--help explains every flag)";
    return out;
  }

  auto fail = [&](const std::string& why) {
    out.kind = ParseOutcome::kUsageError;
    out.text = "loom-run: " + why + "\n" + kUsage + "\n(--help explains every flag)";
    return out;
  };

  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (o.command.empty())
    return fail("no PROGRAM given: expected PROGRAM [ARGS...] after the flags");
  if (o.command.front().size() > 1 && o.command.front()[0] == '-' &&
      app.remaining().front() != "--") {
    return fail("unknown option '" + o.command.front() +
                "' (put PROGRAM after '--' if its name starts with '-')");
  }
  if (app.count("--nproc-per-node") == 0) return fail("--nproc-per-node N is required");
  o.masterAddrGiven = app.count("--master-addr") > 0;
  o.onWorkerFailure = onFailure == "continue" ? LaunchOptions::OnWorkerFailure::kContinue
                                              : LaunchOptions::OnWorkerFailure::kStop;
  o.gracePeriod = seconds(grace);
  o.rdzvTimeout = seconds(rdzvTimeout);
  o.nodeTimeout = seconds(nodeTimeout);
  o.lastCall = seconds(lastCall);
  {
    // "M" or "MIN:MAX", each in 1..65536.
    auto number = [](const std::string& text, int& out) {
      if (text.empty() || text.size() > 6 ||
          text.find_first_not_of("0123456789") != std::string::npos)
        return false;
      out = std::stoi(text);
      return out >= 1 && out <= 65536;
    };
    const auto colon = nnodes.find(':');
    bool ok = false;
    if (colon == std::string::npos) {
      ok = number(nnodes, o.nnodes);
      o.minNodes = o.maxNodes = o.nnodes;
    } else {
      ok = number(nnodes.substr(0, colon), o.minNodes) &&
           number(nnodes.substr(colon + 1), o.maxNodes) && o.minNodes <= o.maxNodes;
      o.elastic = true;
      o.nnodes = o.maxNodes;
    }
    if (!ok) {
      return fail("--nnodes '" + nnodes +
                  "' is not valid: expected M or MIN:MAX with 1 <= MIN <= MAX <= 65536");
    }
  }
  if (o.nodeRank >= o.nnodes) {
    return fail("--node-rank " + std::to_string(o.nodeRank) + " is out of range: expected 0 <= " +
                "node-rank < --nnodes (" + std::to_string(o.nnodes) + ")");
  }
  if (o.elastic) {
    if (app.count("--node-rank") > 0) {
      return fail(
          "--node-rank has no meaning with --nnodes MIN:MAX: nodes get their rank in "
          "each round of the elastic rendezvous");
    }
    if (rdzvEndpoint.empty()) {
      return fail(
          "--nnodes MIN:MAX needs --rdzv-endpoint HOST:PORT: the store every node "
          "meets at (a loom-store; no node hosts it, so that any node may leave)");
    }
  } else if (o.nnodes > 1) {
    if (!o.masterAddrGiven) return fail("--nnodes > 1 needs --master-addr (the address of node 0)");
    if (o.masterPort == 0) return fail("--nnodes > 1 needs --master-port P with P in 1..65535");
  }
  if (o.onWorkerFailure == LaunchOptions::OnWorkerFailure::kContinue && o.nnodes != 1) {
    return fail(
        "--on-worker-failure continue works on a single node only (--nnodes 1): across nodes a "
        "failure ends the round on every node; for jobs that outlive a node use --nnodes "
        "MIN:MAX with a trainer that resumes from its checkpoint");
  }
  if (!rdzvEndpoint.empty()) {
    const auto colon = rdzvEndpoint.rfind(':');
    int port = 0;
    if (colon != std::string::npos) {
      // Digits only, all of them: stoi took "29500abc" as 29500 and "+80.9" as 80.
      const std::string digits = rdzvEndpoint.substr(colon + 1);
      const bool number = !digits.empty() && digits.size() <= 5 &&
                          digits.find_first_not_of("0123456789") == std::string::npos;
      port = number ? std::stoi(digits) : 0;
    }
    if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535) {
      return fail("--rdzv-endpoint '" + rdzvEndpoint + "' is not HOST:PORT with PORT in 1..65535");
    }
    o.rdzvHost = rdzvEndpoint.substr(0, colon);
    o.rdzvPort = port;
  }
  if (o.runId.empty() || o.runId.find('/') != std::string::npos) {
    return fail("--run-id '" + o.runId + "' must be non-empty and contain no '/'");
  }
  // Accepted, as torchrun accepts them, but said: a flag that silently does nothing misleads.
  const auto unused = [&](const char* flag, const std::string& why) {
    if (app.count(flag) > 0) out.unused.push_back(std::string(flag) + " has no effect " + why);
  };
  if (!o.elastic && o.nnodes == 1) {
    const std::string why = "with --nnodes 1: a single node holds no rendezvous";
    for (const char* flag :
         {"--rdzv-endpoint", "--rdzv-timeout-s", "--node-timeout-s", "--rdzv-last-call-s"}) {
      unused(flag, why);
    }
  } else if (!o.elastic) {
    unused("--rdzv-last-call-s", "with a fixed --nnodes M: it applies to --nnodes MIN:MAX");
    if (o.nodeRank == 0) {
      unused("--rdzv-endpoint",
             "on node 0, which hosts the rendezvous store at --master-addr:--master-port");
    }
  }
  return out;
}

}  // namespace loom::run
