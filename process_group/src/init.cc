#include "loom/process_group/init.h"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/interfaces.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/process_group/factory.h"
#include "loom/store/file_store.h"
#include "loom/store/prefix_store.h"
#include "loom/store/tcp_store.h"
#include "pg_settings.h"

namespace loom {

namespace {

const std::string* find(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

// Parses a non-negative decimal integer; InvalidArgumentError naming `name` otherwise.
int parseInt(const std::string& name, const std::string& value, const char* expected) {
  int out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec != std::errc() || ptr != end || out < 0) {
    LOOM_THROW(InvalidArgumentError, name, "='", value, "' is not valid; expected ", expected);
  }
  return out;
}

int requireInt(const Environment& env, const std::string& name, const char* expected,
               const char* launcher) {
  const std::string* v = find(env, name);
  if (!v) {
    LOOM_THROW(InvalidArgumentError, name, " is not set; expected ", expected, " (", launcher,
               " launch)");
  }
  return parseInt(name, *v, expected);
}

int optionalInt(const Environment& env, const std::string& name, const char* expected, int dflt) {
  const std::string* v = find(env, name);
  return v ? parseInt(name, *v, expected) : dflt;
}

int parsePort(const std::string& name, const std::string& value) {
  const int port = parseInt(name, value, "a TCP port number (1-65535)");
  if (port < 1 || port > 65535) {
    LOOM_THROW(InvalidArgumentError, name, "='", value,
               "' is not valid; expected a TCP port number (1-65535)");
  }
  return port;
}

void checkRanks(const LaunchEnv& out, const char* rankVar, const char* sizeVar) {
  if (out.worldSize < 1) {
    LOOM_THROW(InvalidArgumentError, sizeVar, "=", out.worldSize,
               " is not valid; expected a world size >= 1");
  }
  if (out.rank >= out.worldSize) {
    LOOM_THROW(InvalidArgumentError, rankVar, "=", out.rank, " is out of range for ", sizeVar, "=",
               out.worldSize, "; expected 0 <= rank < world size");
  }
  if (out.localWorldSize < 1 || out.localRank >= out.localWorldSize) {
    LOOM_THROW(InvalidArgumentError, "local rank ", out.localRank,
               " is out of range for local world size ", out.localWorldSize, " (", out.launcher,
               " launch)");
  }
}

}  // namespace

std::string firstSlurmHost(std::string_view nodelist) {
  // The first entry ends at a comma outside brackets.
  int depth = 0;
  size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string_view first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (first.empty() || depth != 0) {
    LOOM_THROW(InvalidArgumentError, "SLURM node list '", nodelist,
               "' is not valid; expected host names like node[01-04],login1");
  }
  if (open == std::string_view::npos) return std::string(first);
  const size_t close = first.find(']', open);
  if (close == std::string_view::npos || close == open + 1) {
    LOOM_THROW(InvalidArgumentError, "SLURM node list '", nodelist,
               "' is not valid; expected host names like node[01-04],login1");
  }
  std::string_view range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find(','));
  range = range.substr(0, range.find('-'));
  return std::string(first.substr(0, open)) + std::string(range) +
         std::string(first.substr(close + 1));
}

int slurmTasksOnNode(std::string_view tasksPerNode, int nodeId) {
  // Entries "N" or "N(xM)", comma separated.
  const std::string spec(tasksPerNode);
  int node = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string entry = spec.substr(pos, comma - pos);
    const size_t paren = entry.find("(x");
    const int tasks =
        parseInt("SLURM_TASKS_PER_NODE", entry.substr(0, paren), "a list like 2(x3),1");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (entry.back() != ')') {
        LOOM_THROW(InvalidArgumentError, "SLURM_TASKS_PER_NODE='", tasksPerNode,
                   "' is not valid; expected a list like 2(x3),1");
      }
      repeat = parseInt("SLURM_TASKS_PER_NODE", entry.substr(paren + 2, entry.size() - paren - 3),
                        "a list like 2(x3),1");
    }
    if (nodeId < node + repeat) return tasks;
    node += repeat;
    pos = comma + 1;
  }
  LOOM_THROW(InvalidArgumentError, "SLURM_TASKS_PER_NODE='", tasksPerNode, "' lists ", node,
             " nodes but SLURM_NODEID is ", nodeId);
}

LaunchEnv parseLaunchEnv(const Environment& env, bool needMaster) {
  LaunchEnv out;
  const char* rankVar = "RANK";
  const char* sizeVar = "WORLD_SIZE";
  if (find(env, "RANK") || find(env, "WORLD_SIZE")) {
    out.launcher = "torchrun";
    out.rank = requireInt(env, "RANK", "this process's rank, an integer >= 0", "torchrun");
    out.worldSize =
        requireInt(env, "WORLD_SIZE", "the number of processes, an integer >= 1", "torchrun");
    out.localRank =
        optionalInt(env, "LOCAL_RANK", "the rank on this node, an integer >= 0", out.rank);
    out.localWorldSize = optionalInt(env, "LOCAL_WORLD_SIZE",
                                     "the number of processes on this node, an integer >= 1",
                                     find(env, "LOCAL_RANK") ? out.worldSize : out.worldSize);
  } else if (find(env, "SLURM_PROCID")) {
    out.launcher = "slurm";
    rankVar = "SLURM_PROCID";
    sizeVar = "SLURM_NTASKS";
    out.rank = requireInt(env, "SLURM_PROCID", "this task's rank, an integer >= 0", "srun");
    out.worldSize = requireInt(env, "SLURM_NTASKS", "the number of tasks, an integer >= 1", "srun");
    out.localRank = optionalInt(env, "SLURM_LOCALID", "the task's rank on its node", out.rank);
    const int nodeId = optionalInt(env, "SLURM_NODEID", "the node's index in the job", 0);
    if (const std::string* tpn = find(env, "SLURM_TASKS_PER_NODE")) {
      out.localWorldSize = slurmTasksOnNode(*tpn, nodeId);
    } else {
      out.localWorldSize = out.worldSize;
    }
    const std::string* nodelist = find(env, "SLURM_JOB_NODELIST");
    if (!nodelist) nodelist = find(env, "SLURM_NODELIST");
    if (nodelist) out.masterAddr = firstSlurmHost(*nodelist);
    if (const std::string* job = find(env, "SLURM_JOB_ID")) {
      // Job ids pass 2^31 on long-lived clusters: parsed as 64 bits.
      uint64_t id = 0;
      const char* end = job->data() + job->size();
      const auto [ptr, ec] = std::from_chars(job->data(), end, id);
      if (job->empty() || ec != std::errc() || ptr != end) {
        LOOM_THROW(InvalidArgumentError, "SLURM_JOB_ID='", *job,
                   "' is not valid; expected the SLURM job id, a non-negative integer");
      }
      out.masterPort = 29500 + static_cast<int>(id % 1000);
    }
  } else if (find(env, "OMPI_COMM_WORLD_RANK")) {
    out.launcher = "openmpi";
    rankVar = "OMPI_COMM_WORLD_RANK";
    sizeVar = "OMPI_COMM_WORLD_SIZE";
    out.rank = requireInt(env, "OMPI_COMM_WORLD_RANK", "this process's rank", "mpirun");
    out.worldSize = requireInt(env, "OMPI_COMM_WORLD_SIZE", "the number of processes", "mpirun");
    out.localRank =
        optionalInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", "the rank on this node", out.rank);
    out.localWorldSize = optionalInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "the number of processes on this node", out.worldSize);
  } else {
    LOOM_THROW(InvalidArgumentError,
               "RANK is not set; expected RANK and WORLD_SIZE (torchrun / loom-run), "
               "SLURM_PROCID and SLURM_NTASKS (srun) or OMPI_COMM_WORLD_RANK and "
               "OMPI_COMM_WORLD_SIZE (mpirun), or an init method tcp://host:port or "
               "file:///path with an explicit rank and world size");
  }
  checkRanks(out, rankVar, sizeVar);

  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    if (addr->empty()) {
      LOOM_THROW(InvalidArgumentError,
                 "MASTER_ADDR is empty; expected the host name or address of rank 0");
    }
    out.masterAddr = *addr;
  }
  if (const std::string* port = find(env, "MASTER_PORT"))
    out.masterPort = parsePort("MASTER_PORT", *port);
  if (needMaster) {
    if (out.masterAddr.empty()) {
      LOOM_THROW(InvalidArgumentError,
                 "MASTER_ADDR is not set; expected the host name or address of rank 0 (",
                 out.launcher, " launch, init method env://)");
    }
    if (out.masterPort == 0) {
      LOOM_THROW(InvalidArgumentError,
                 "MASTER_PORT is not set; expected a free TCP port on MASTER_ADDR (", out.launcher,
                 " launch, init method env://)");
    }
  }
  return out;
}

InitMethod parseInitMethod(std::string_view url) {
  InitMethod out;
  const auto bad = [&](const char* why) {
    LOOM_THROW(InvalidArgumentError, "init method '", url, "' is not valid (", why,
               "); expected env://, tcp://host:port or file:///absolute/path");
  };
  if (url == "env://") return out;
  if (url.starts_with("tcp://")) {
    out.kind = InitMethod::Kind::kTcp;
    std::string_view rest = url.substr(6);
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) bad("no host:port");
    std::string_view host = rest.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [::1]:29500
    }
    out.host = std::string(host);
    const std::string port(rest.substr(colon + 1));
    out.port = parsePort("init method port", port);
    return out;
  }
  if (url.starts_with("file://")) {
    out.kind = InitMethod::Kind::kFile;
    out.path = std::string(url.substr(7));
    if (out.path.empty() || out.path.front() != '/')
      bad("the path must be absolute: file:///dir/file");
    return out;
  }
  bad("unknown scheme");
  return out;
}

InitResult initProcessGroup(const InitOptions& userOptions) {
  const InitOptions options = withEnvironment(userOptions);
  const InitMethod method =
      parseInitMethod(options.initMethod.empty() ? "env://" : options.initMethod);
  const Environment env = launchEnvironment();

  InitResult result;
  const bool explicitRanks = options.rank >= 0 && options.worldSize >= 0;
  if (explicitRanks && method.kind != InitMethod::Kind::kEnv) {
    result.env.rank = options.rank;
    result.env.worldSize = options.worldSize;
    result.env.localRank = options.rank;
    result.env.localWorldSize = options.worldSize;
    result.env.launcher = "explicit";
  } else {
    // The mpi backend needs no store to set up (MPI is its rendezvous): env:// without
    // MASTER_ADDR is fine for it.
    result.env =
        parseLaunchEnv(env, method.kind == InitMethod::Kind::kEnv && options.backend != "mpi");
    if (options.rank >= 0) result.env.rank = options.rank;
    if (options.worldSize >= 0) result.env.worldSize = options.worldSize;
  }
  const int rank = result.env.rank;
  const int size = result.env.worldSize;
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank,
             " is out of range for world size ", size, " (expected 0 <= rank < world size)");
  // Before the store: rank 0 failing after it started the store server would leave the
  // others retrying to connect to it until their timeout.
  checkAvailable(options.backend);

  if (options.backend == "mpi" && method.kind == InitMethod::Kind::kEnv &&
      (result.env.masterAddr.empty() || result.env.masterPort == 0)) {
    // No store: the group's membership comes from MPI, and monitoredBarrier is unavailable.
    result.pg = createProcessGroup(options.backend, nullptr, rank, size, options.pg);
    return result;
  }
  const bool agentStore =
      method.kind == InitMethod::Kind::kEnv && settings::flag("LOOM_AGENT_STORE").value_or(false);
  if (method.kind == InitMethod::Kind::kFile) {
    FileStoreOptions fileOptions;
    fileOptions.timeout = options.pg.timeout;
    result.store = std::make_shared<FileStore>(method.path, fileOptions);
  } else {
    const std::string host =
        method.kind == InitMethod::Kind::kTcp ? method.host : result.env.masterAddr;
    const int port = method.kind == InitMethod::Kind::kTcp ? method.port : result.env.masterPort;
    TCPStoreOptions storeOptions;
    storeOptions.timeout = options.pg.timeout;
    storeOptions.rank = rank;
    // Under a launcher that hosts the store (LOOM_AGENT_STORE), rank 0 is a client like the
    // others, so losing rank 0 does not take the store with it.
    storeOptions.isServer = rank == 0 && !agentStore;
    storeOptions.numWorkers = size;
    storeOptions.waitForWorkers = false;
    result.store = std::make_shared<TCPStore>(host, port, storeOptions);
  }
  result.store->setTimeout(options.pg.timeout);
  ProcessGroupOptions pgOptions = options.pg;
  // Rank 0 hosts the TCPStore: a failure that finds the store gone names it.
  if (method.kind != InitMethod::Kind::kFile && !agentStore && pgOptions.storeHostRank < 0) {
    pgOptions.storeHostRank = 0;
  }
  if (pgOptions.comm.context.host.empty() && method.kind != InitMethod::Kind::kFile) {
    // Listen where the peers can reach us: LOOM_SOCKET_IFNAME's interface, else the address on
    // the route to the store's host, not the host name (Debian maps it to 127.0.1.1, useless
    // to ranks on other machines).
    const std::string storeHost =
        method.kind == InitMethod::Kind::kTcp ? method.host : result.env.masterAddr;
    pgOptions.comm.context.host = net::defaultListenAddress(storeHost);
  }
  auto pgStore = std::make_shared<PrefixStore>("default_pg", result.store);
  result.pg = createProcessGroup(options.backend, pgStore, rank, size, pgOptions);
  return result;
}

}  // namespace loom
