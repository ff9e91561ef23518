// Starting a job's default process group from the environment (c10d's init_process_group).
//
// Contract
// - parseLaunchEnv(env) is pure: it reads the launcher's variables from `env` and returns who
//   this process is. It knows three launchers, tried in this order:
//     torchrun / loom-run  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                          MASTER_PORT (LOCAL_* default to RANK / WORLD_SIZE when absent)
//     srun (SLURM)         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                          SLURM_TASKS_PER_NODE (for LOCAL_WORLD_SIZE); MASTER_ADDR defaults
//                          to the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST),
//                          MASTER_PORT to 29500 + SLURM_JOB_ID % 1000
//     mpirun (Open MPI)    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                          OMPI_COMM_WORLD_LOCAL_SIZE; MASTER_ADDR / MASTER_PORT from the env
//   MASTER_ADDR / MASTER_PORT set explicitly always win. A missing or invalid variable is an
//   InvalidArgumentError naming the variable, its value and what was expected. Address and
//   port are only required when `needMaster` (init_method env://).
// - parseInitMethod(url): "env://", "tcp://host:port" or "file:///absolute/path";
//   anything else is an InvalidArgumentError.
// - initProcessGroup(options) creates the store and the default group, collectively:
//     env://        rank 0 hosts a TCPStore server at MASTER_ADDR:MASTER_PORT in this process,
//                   the others connect to it;
//     tcp://h:p     the same with h:p;
//     file:///path  a FileStore at /path (a file on a filesystem every rank sees; use a
//                   fresh path per job: the file keeps the keys of earlier runs).
//   The "mpi" backend with env:// and no MASTER_ADDR / MASTER_PORT (a plain mpirun) creates no
//   store: the group comes from MPI alone and InitResult::store is null.
//   Rank and world size come from options.rank / options.worldSize when set (>= 0), else the
//   environment. A backend that is not available here (factory.h: checkAvailable) fails
//   before the store is created, on every rank alike. The group gets its own namespace
//   ("default_pg/") in the store, so the returned store may be used for other keys. Returns
//   once every rank is connected, or throws TimeoutError after options.pg.timeout.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "loom/process_group/process_group.h"

namespace loom {

struct LaunchEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  std::string masterAddr;  // empty when unknown
  int masterPort = 0;      // 0 when unknown
  std::string launcher;    // "torchrun", "slurm" or "openmpi"
};

using Environment = std::map<std::string, std::string>;

LaunchEnv parseLaunchEnv(const Environment& env, bool needMaster = true);
// The launch variables this process has (settings.h: Section::kLaunch, RANK ... MASTER_PORT,
// SLURM_*, OMPI_*), for parseLaunchEnv.
Environment launchEnvironment();

struct InitMethod {
  enum class Kind { kEnv, kTcp, kFile };
  Kind kind = Kind::kEnv;
  std::string host;  // kTcp
  int port = 0;      // kTcp
  std::string path;  // kFile
};
InitMethod parseInitMethod(std::string_view url);

// SLURM hostlist expressions: "node[03-05,9],login1" -> "node03". Throws on a malformed list.
std::string firstSlurmHost(std::string_view nodelist);
// SLURM_TASKS_PER_NODE "2(x3),1" -> the task count of node `nodeId` (0-based).
int slurmTasksOnNode(std::string_view tasksPerNode, int nodeId);

struct InitOptions {
  std::string backend = "tcp";
  // "env://", "tcp://host:port" or "file:///path"; empty = LOOM_INIT_METHOD or env://.
  // The group's options (pg) take the environment's values as createProcessGroup's do; when
  // neither pg.comm.context.host nor LOOM_HOST names one, the comm backend listens on the
  // address on the route to the store's host.
  std::string initMethod{};
  int rank = -1;       // >= 0 overrides the environment
  int worldSize = -1;  // >= 0 overrides the environment
  ProcessGroupOptions pg{};
};

struct InitResult {
  std::shared_ptr<Store> store;  // the job's store (the group uses "default_pg/" inside it)
  std::shared_ptr<ProcessGroup> pg;
  LaunchEnv env;
};

InitResult initProcessGroup(const InitOptions& options = {});

}  // namespace loom
