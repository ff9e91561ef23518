// The declaration of every environment variable Loom reads (settings.h). docs/env.md is
// generated from this table: change a row here, then run
//   build/bin/loom-settings --markdown > docs/env.md
#include "settings_table.h"

namespace loom::settings {

namespace {

using K = Kind;
using S = Section;
constexpr long long kGiB = 1LL << 30;
constexpr long long kMicros10s = 10'000'000;

constexpr Setting kTable[] = {
    // ---- comm: the Context and its engines ----
    {"LOOM_ALGO", K::kChoice, S::kRuntime, "auto", 0, 0,
     "auto|shm|ring|rd|recursive_doubling|hd|halving_doubling|rabenseifner|direct|tree|binomial|"
     "chain|pipeline",
     "",
     "forces one generic algorithm, over the transport, for the collectives that implement it; "
     "the others keep their automatic choice, the shared-memory arena included, and one "
     "warning per process names them (auto and shm: the automatic choice everywhere)",
     "comm::ContextOptions::algorithm", "Context setup"},
    {"LOOM_CHUNK_BYTES", K::kBytes, S::kRuntime, "512K", 4096, kGiB, "", "",
     "message size of the chunked, pipelined algorithms (ring, halving-doubling, chain)",
     "comm::ContextOptions::chunkBytes", "Context setup"},
    {"LOOM_REDUCE_ISA", K::kChoice, S::kRuntime, "auto", 0, 0, "auto|generic", "",
     "generic forces the portable reduce kernels; auto takes AVX2/FMA/F16C ones where the CPU "
     "has them (process-wide: the last Context created sets it)",
     "comm::ContextOptions::reduceIsa", "Context setup"},
    {"LOOM_HOST", K::kText, S::kRuntime, "", 0, 0, "", "",
     "where the tcp transport listens and what it publishes to its peers (default: the host "
     "name; initProcessGroup: the address on the route to the store's host); loom-run sets it "
     "on multi-node jobs",
     "comm::ContextOptions::host", "Context setup, initProcessGroup, loom-run"},
    {"LOOM_SOCKET_IFNAME", K::kText, S::kRuntime, "", 0, 0, "", "",
     "the network interface the tcp transport listens on when neither ContextOptions::host nor "
     "LOOM_HOST names an address, in NCCL_SOCKET_IFNAME's syntax: name prefixes (eth,ib), ^ "
     "to exclude them (^docker,lo), = for exact names (=eth0); its first IPv4 address, else "
     "IPv6 (loom-run passes it on as LOOM_HOST; docs/launcher.md)",
     "comm::ContextOptions::host", "Context setup, initProcessGroup, torch backend, loom-run"},
    {"LOOM_TCP_BUSY_US", K::kInteger, S::kRuntime, "1000", 0, kMicros10s, "", "µs",
     "how long a thread driving the sockets polls without blocking while bytes flow (0: block "
     "at once)",
     "comm::ContextOptions::busyPollUs", "Context setup"},
    {"LOOM_TCP_SEND_BYTES", K::kBytes, S::kRuntime, "512K", 4096, kGiB, "", "",
     "bytes handed to one sendmsg call", "comm::ContextOptions::tcpSendBytes", "Context setup"},
    {"LOOM_TCP_BUFFER_BYTES", K::kBytes, S::kRuntime, "auto", 1, kGiB, "auto", "",
     "SO_SNDBUF/SO_RCVBUF of every socket (auto: the kernel's autotuning)",
     "comm::ContextOptions::socketBufferBytes", "Context setup"},
    {"LOOM_SPIN_US", K::kInteger, S::kRuntime, "50", 0, kMicros10s, "", "µs",
     "how long a wait on a small (<= 64 KiB) tcp message spins before it drives the sockets",
     "comm::ContextOptions::tcpSpinUs", "Context setup"},
    {"LOOM_TCP_SOCKETS", K::kInteger, S::kRuntime, "1", 1, 16, "", "",
     "TCP connections per peer pair; messages of 256 KiB and more are striped across them; "
     "must be equal on all ranks",
     "comm::ContextOptions::tcpSockets", "Context setup"},
    {"LOOM_TCP_RECONNECT_MS", K::kInteger, S::kRuntime, "10000", 0, 3'600'000, "", "ms",
     "how long a lost TCP connection to a live peer may take to be re-established (what the "
     "peer had not read is sent again) before the job fails; 0: a lost connection fails at "
     "once; zero on all ranks or on none",
     "comm::ContextOptions::tcpReconnectMs", "Context setup"},
    {"LOOM_TCP_HEAL_LOCAL", K::kFlag, S::kRuntime, "0", 0, 0, "", "",
     "TCP connections between ranks of one host heal too (they keep a copy of what they send); "
     "equal on all ranks",
     "comm::ContextOptions::tcpHealLocal", "Context setup"},
    {"LOOM_SHM", K::kFlag, S::kRuntime, "1", 0, 0, "", "",
     "shared memory for same-host ranks (arena and point-to-point); 0: tcp only",
     "comm::ContextOptions::sharedMemory", "Context setup"},
    {"LOOM_SHM_P2P", K::kFlag, S::kRuntime, "1", 0, 0, "", "",
     "shared-memory point-to-point; 0 keeps send/recv on tcp while collectives use the arena",
     "comm::ContextOptions::shmPointToPoint", "Context setup"},
    {"LOOM_SHM_HOST_ID", K::kText, S::kRuntime, "", 0, 0, "", "",
     "replaces the host identity (boot id, host name and namespaces) that decides which ranks "
     "share memory; tests split one machine into hosts with it",
     "comm::ContextOptions::shmHostId", "Context setup"},
    {"LOOM_SHM_MEMFD", K::kFlag, S::kRuntime, "1", 0, 0, "", "",
     "0 skips the anonymous memfd and uses the named-segment fallback",
     "comm::ContextOptions::shmMemfd", "Context setup"},
    {"LOOM_SHM_SLOT_BYTES", K::kBytes, S::kRuntime, "", 4096, kGiB, "", "",
     "size of each arena staging slot, rounded up to 4 KiB (default: 2 MiB up to 4 ranks, "
     "else 1 MiB); must be equal on all ranks",
     "comm::ContextOptions::shmSlotBytes", "Context setup"},
    {"LOOM_SHM_RING_BYTES", K::kBytes, S::kRuntime, "", 4096, kGiB, "", "",
     "size of each shared-memory point-to-point ring, rounded up to 4 KiB (default: 1 MiB up "
     "to 4 local ranks, else 256 KiB); must be equal on all ranks",
     "comm::ContextOptions::shmRingBytes", "Context setup"},
    {"LOOM_SHM_SPIN_US", K::kInteger, S::kRuntime, "", 0, kMicros10s, "", "µs",
     "how long a shared-memory waiter spins before yielding (default: 1000; 0 when local ranks "
     "outnumber CPUs)",
     "comm::ContextOptions::shmSpinUs", "Context setup"},
    {"LOOM_SHM_YIELD_US", K::kInteger, S::kRuntime, "", 0, kMicros10s, "", "µs",
     "how long a shared-memory waiter then yields before it sleeps on a futex (default: 1000; "
     "2000 when local ranks outnumber CPUs)",
     "comm::ContextOptions::shmYieldUs", "Context setup"},
    {"LOOM_SCHEDULE_NOISE_US", K::kInteger, S::kRuntime, "0", 0, 1'000'000, "", "µs",
     "test-only: > 0 makes the shared-memory paths, the tcp transport's healing and closing and "
     "the process group's hand-off sleep a random 0..N µs at the points where ranks and "
     "threads race (before a health check, before a rank says it started, posted or closed, "
     "before a thread claims an operation), to find races in tests; never for a run that is "
     "measured (docs/architecture.md)",
     "loom::scheduleNoiseUs (process-wide)", "Context setup"},
    {"LOOM_SHM_FOLD_SKEW", K::kFlag, S::kRuntime, "0", 0, 0, "", "",
     "1: the shared-memory reductions read their peers skewed and rotated per rank; 0: block "
     "after block in rank order, measured faster on 16 cores (the same bits either way)",
     "comm::ContextOptions::shmFoldSkew", "Context setup"},
    {"LOOM_SHM_COPY_THREADS", K::kInteger, S::kRuntime, "0", 0, 64, "auto", "",
     "helper threads per rank that share the staged shared-memory all-reduce's copies and "
     "folds of 256 KiB steps and more (the same bits); 0: none; auto: floor(CPUs / local "
     "ranks) - 1 when >= 1; not the default until measured on a many-core machine",
     "comm::ContextOptions::shmCopyThreads", "Context setup"},
    {"LOOM_SHM_SINGLE_COPY", K::kChoice, S::kRuntime, "auto", 0, 0, "auto|on|off", "",
     "single-copy shared memory: large all-reduce, reduce-scatter, broadcast and all-gather read "
     "peers' buffers directly (process_vm_readv) when a setup probe succeeds on every rank; auto "
     "where measured faster (on the 2-core dev VM nowhere: staged), on at every size (when every "
     "rank says on), off never "
     "(one rank off turns it off for all)",
     "comm::ContextOptions::shmSingleCopy", "Context setup"},
    {"LOOM_SHM_WINDOWS", K::kFlag, S::kRuntime, "1", 0, 0, "", "",
     "zero-copy windows: large all-reduce, reduce-scatter, broadcast and all-gather whose buffers "
     "lie in loom::comm::Window memory on every rank read and reduce peers' memory directly (one "
     "copy per byte) when a setup probe maps a window on every rank; 0 on any rank keeps window "
     "buffers on the staged path for all",
     "comm::ContextOptions::shmWindows", "Context setup"},
    {"LOOM_SHM_WINDOW_MIN_BYTES", K::kBytes, S::kRuntime, "", 0, kGiB, "", "",
     "smallest collective (nccl-tests' size: all-gather and reduce-scatter count every rank's "
     "part) that takes the zero-copy window path, for every operation (default: measured per "
     "operation, docs/shm.md: 16 KiB, or 64-256 KiB for all but all-reduce when local "
     "ranks outnumber CPUs); must be equal on all ranks",
     "comm::ContextOptions::shmWindowMinBytes", "Context setup"},
    {"LOOM_TUNING_FILE", K::kText, S::kRuntime, "", 0, 0, "", "",
     "a tuning file written by loom-bench --tune: the automatic algorithm choice takes its "
     "crossovers for the group's topology (world size, ranks per host, transport), and shared "
     "memory its single-copy sizes (OP.cma_min / OP.cma_max); a missing, "
     "stale or malformed file, or one without this topology, gives one warning and the built-in "
     "table",
     "comm::ContextOptions::tuningFile", "Context setup"},
    {"LOOM_REPRODUCIBLE", K::kFlag, S::kRuntime, "0", 0, 0, "", "",
     "reproducible reductions: sum and avg over float, double, half and bfloat16 give the "
     "correctly rounded result, bitwise the same whatever the algorithm, transport, chunk size, "
     "tuning or rank order (docs/reproducible.md); prod over floats is refused; equal on all "
     "ranks; the nccl and mpi backends, which have no such mode, refuse to start with it; the "
     "verbs backend ignores it (createVerbsContext does not take it: docs/reproducible.md)",
     "comm::ContextOptions::reproducible", "Context setup"},
    {"LOOM_TUNING_CACHE", K::kText, S::kRuntime, "", 0, 0, "", "",
     "the directory of the per-host tuning cache that loom-bench --tune writes and every group "
     "reads when LOOM_TUNING_FILE is unset (default: $XDG_CACHE_HOME/loom, else "
     "$HOME/.cache/loom); off (in any case): no cache",
     "comm::ContextOptions::tuningCache", "Context setup, loom-bench --tune"},
    {"LOOM_IB_DEVICE", K::kText, S::kRuntime, "", 0, 0, "", "",
     "which RDMA device the verbs transport opens (default: the first)",
     "comm::VerbsOptions::device", "verbs Context setup"},
    {"LOOM_IB_PORT", K::kInteger, S::kRuntime, "1", 1, 255, "", "", "the RDMA device port",
     "comm::VerbsOptions::port", "verbs Context setup"},
    {"LOOM_IB_GID_INDEX", K::kInteger, S::kRuntime, "0", 0, 65535, "", "", "GID table index (RoCE)",
     "comm::VerbsOptions::gidIndex", "verbs Context setup"},
    {"LOOM_IB_SLOTS", K::kInteger, S::kRuntime, "16", 2, 4096, "", "",
     "slots in each peer's receive ring; equal on all ranks", "comm::VerbsOptions::slots",
     "verbs Context setup"},
    {"LOOM_IB_SLOT_BYTES", K::kBytes, S::kRuntime, "64K", 256, 64LL << 20, "", "",
     "bytes per verbs slot, header included; equal on all ranks", "comm::VerbsOptions::slotBytes",
     "verbs Context setup"},

    // ---- process_group ----
    {"LOOM_DEBUG", K::kChoice, S::kRuntime, "OFF", 0, 0, "OFF|0|INFO|DETAIL", "",
     "INFO logs group setup and hand-off counters; DETAIL also checks that every rank calls "
     "the same collective with the same signature",
     "ProcessGroupOptions::debug", "ProcessGroup setup"},
    {"LOOM_NCCL_WAIT_SPIN_US", K::kInteger, S::kRuntime, "50", 0, kMicros10s, "", "µs",
     "how long a host wait of the nccl backend queries the operation's event before it waits "
     "in cudaEventSynchronize",
     "ProcessGroupOptions::nccl.hostSpin", "ProcessGroup setup"},
    {"LOOM_PG_NAP_US", K::kInteger, S::kRuntime, "1000", 0, 1'000'000, "", "µs",
     "how long the comm backend's worker naps while waiting threads run operations themselves "
     "(docs/handoff.md)",
     "ProcessGroupOptions::comm.napUs", "ProcessGroup setup"},
    {"LOOM_FLIGHT_RECORDER_ENTRIES", K::kInteger, S::kRuntime, "2000", 0, 10'000'000, "",
     "operations",
     "how many of its last operations each process group keeps in its flight recorder for "
     "dumps and failure analysis (docs/diagnostics.md); 0 turns the recorder off",
     "ProcessGroupOptions::flightRecorderEntries", "ProcessGroup setup"},
    {"LOOM_FLIGHT_RECORDER_PRECISE_EVERY", K::kInteger, S::kRuntime, "256", 1, 1'048'576, "",
     "operations",
     "every how many operations (by sequence number, rounded up to a power of two) the flight "
     "recorder reads the time-stamp counter for start and end, besides every operation of 64 "
     "KiB or more; the others take the worker's millisecond tick when it runs "
     "(docs/diagnostics.md); 1: every operation",
     "ProcessGroupOptions::flightRecorderPreciseEvery", "ProcessGroup setup"},
    {"LOOM_DUMP_DIR", K::kText, S::kRuntime, "", 0, 0, "", "",
     "directory where flight record dumps (on failure, abort, SIGUSR1, dumpFlightRecord) are "
     "written as JSON, one file per rank and group (docs/diagnostics.md); unset: the store only",
     "ProcessGroupOptions::dumpDir", "ProcessGroup setup"},
    {"LOOM_TRACE", K::kText, S::kRuntime, "", 0, 0, "", "",
     "directory where each process writes its Chrome / Perfetto trace (collectives with seq and "
     "bytes, and spans added through loom/process_group/trace.h) as loom-trace-rank<r>.json; "
     "`loom-trace merge` joins the ranks (docs/diagnostics.md); unset: no trace",
     "ProcessGroupOptions::traceDir", "ProcessGroup setup"},
    {"LOOM_HEARTBEAT_MS", K::kInteger, S::kRuntime, "1000", 0, 3'600'000, "", "ms",
     "how often each rank publishes a heartbeat (host, pid, time, progress) in the store, read by "
     "the failure analysis to tell a rank alive but not progressing from a dead one "
     "(docs/diagnostics.md); 0: only the first beat, at construction (host and pid)",
     "ProcessGroupOptions::heartbeatInterval", "ProcessGroup setup"},
    {"LOOM_PG_GRACE_US", K::kInteger, S::kRuntime, "50", 0, 1'000'000, "", "µs",
     "how long the comm backend's worker leaves a fresh lone operation to the thread that will "
     "wait on it (docs/handoff.md)",
     "ProcessGroupOptions::comm.graceUs", "ProcessGroup setup"},

    // ---- common, store ----
    {"LOOM_LOG_LEVEL", K::kChoice, S::kRuntime, "warning", 0, 0,
     "debug|info|warning|warn|error|off", "",
     "the log level (setLogLevel changes it); a bad value is a warning, never an error",
     "setLogLevel", "first log call"},
    {"LOOM_STORE_TOKEN", K::kText, S::kRuntime, "", 0, 0, "", "",
     "shared secret a TCPStore client presents and its server checks (default: none)",
     "TCPStoreOptions::token, TCPStoreServerOptions::token", "TCPStore construction"},
    {"LOOM_STORE_DIR", K::kText, S::kRuntime, "", 0, 0, "", "",
     "directory where loom-store persists its keys (an append-only log and snapshots, "
     "docs/store.md); unset: keys live in memory only",
     "loom-store --data-dir", "loom-store start"},
    {"LOOM_STORE_FSYNC", K::kChoice, S::kRuntime, "always", 0, 0, "always|never", "",
     "a persisting store server fdatasyncs each change before answering (always: survives a "
     "machine crash) or only writes it (never: survives the server being killed)",
     "TCPStoreServerOptions::fsync", "TCPStore server construction"},
    {"LOOM_STORE_RECONNECT_MS", K::kInteger, S::kRuntime, "0", 0, 86'400'000, "", "ms",
     "how long a TCPStore client keeps reconnecting after it lost its server (a restarted "
     "loom-store) before the store becomes unusable; 0: fail at once",
     "TCPStoreOptions::reconnectTimeout", "TCPStore construction"},

    // ---- autograd_lite (read by programs: autograd_lite itself reads no environment) ----
    {"LOOM_AUTOGRAD_THREADS", K::kInteger, S::kRuntime, "", 1, 4096, "", "threads",
     "how many threads autograd_lite's kernels (matrix products, convolutions, norms) use "
     "(default: the CPUs this process may run on, sched_getaffinity)",
     "loom::ag::setNumThreads",
     "program start (loom-train, autograd-mlp, autograd_mlp_bench, autograd_gpt_bench)"},

    // ---- spawn, rpc ----
    {"LOOM_SPAWN_TIMEOUT", K::kInteger, S::kRuntime, "86400", 1, 365LL * 86400, "", "s",
     "how long spawn() waits for its ranks before it stops them and throws TimeoutError",
     "SpawnOptions::timeout", "spawn"},
    {"LOOM_RPC_TIMEOUT", K::kInteger, S::kRuntime, "60000", 1, 86'400'000, "", "ms",
     "default deadline of an RPC call (rpcSync, rpcAsync, remote, toHere) and of the "
     "rendezvous and shutdown barrier",
     "rpc::RpcOptions::timeout", "RpcAgent construction"},
    {"LOOM_RPC_THREADS", K::kInteger, S::kRuntime, "8", 1, 1024, "", "",
     "threads that run incoming RPC requests on each worker", "rpc::RpcOptions::numThreads",
     "RpcAgent construction"},
    {"LOOM_RPC_MAX_CONNECTIONS", K::kInteger, S::kRuntime, "1024", 1, 65536, "", "",
     "inbound connections an RPC worker serves at once (each holds a reader thread); more are "
     "refused and logged",
     "rpc::RpcOptions::maxConnections", "RpcAgent construction"},
    {"LOOM_RPC_HOST", K::kText, S::kRuntime, "", 0, 0, "", "",
     "the address an RPC worker publishes to its peers and listens on (default: the address "
     "on the route to the store's host, else the host name)",
     "rpc::RpcOptions::host", "RpcAgent construction"},

    // ---- launch ----
    {"LOOM_INIT_METHOD", K::kText, S::kLaunch, "env://", 0, 0, "", "",
     "how ranks meet: env://, tcp://host:port or file:///absolute/path", "InitOptions::initMethod",
     "initProcessGroup"},
    {"RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "this process's rank, 0 <= RANK < WORLD_SIZE (torchrun, loom-run); required for env://",
     "InitOptions::rank", "initProcessGroup, bench programs"},
    {"WORLD_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "the number of processes; required for env://", "InitOptions::worldSize",
     "initProcessGroup, bench programs"},
    {"LOCAL_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "rank on this node (default: RANK); also picks the CUDA device of the nccl backend",
     "LaunchEnv::localRank, NcclOptions::localRank", "initProcessGroup, nccl setup"},
    {"LOCAL_WORLD_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "process count on this node (default: WORLD_SIZE)", "LaunchEnv::localWorldSize",
     "initProcessGroup"},
    {"MASTER_ADDR", K::kText, S::kLaunch, "", 0, 0, "", "",
     "the host where rank 0 serves the job's TCPStore; required for env://",
     "LaunchEnv::masterAddr", "initProcessGroup"},
    {"MASTER_PORT", K::kInteger, S::kLaunch, "", 1, 65535, "", "",
     "the port of the job's TCPStore; required for env://", "LaunchEnv::masterPort",
     "initProcessGroup"},
    {"NODE_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "this node's index, which loom-run gives its workers (as torchrun does); Loom's library "
     "does not read it",
     "(the workers)", "loom-run sets it"},
    {"SLURM_PROCID", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "rank under srun (read when RANK is unset)", "LaunchEnv::rank", "initProcessGroup"},
    {"SLURM_NTASKS", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "world size under srun", "LaunchEnv::worldSize", "initProcessGroup"},
    {"SLURM_LOCALID", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "local rank under srun", "LaunchEnv::localRank", "initProcessGroup"},
    {"SLURM_NODEID", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "node index under srun: which entry of SLURM_TASKS_PER_NODE is this node's",
     "LaunchEnv::localWorldSize", "initProcessGroup"},
    {"SLURM_TASKS_PER_NODE", K::kText, S::kLaunch, "", 0, 0, "", "",
     "tasks per node under srun (\"4(x2)\"), for the local world size", "LaunchEnv::localWorldSize",
     "initProcessGroup"},
    {"SLURM_JOB_NODELIST", K::kText, S::kLaunch, "", 0, 0, "", "",
     "the job's nodes under srun; the first is the master host (SLURM_NODELIST also read)",
     "LaunchEnv::masterAddr", "initProcessGroup"},
    {"SLURM_NODELIST", K::kText, S::kLaunch, "", 0, 0, "", "", "older name of SLURM_JOB_NODELIST",
     "LaunchEnv::masterAddr", "initProcessGroup"},
    {"SLURM_JOB_ID", K::kInteger, S::kLaunch, "", 0, (1LL << 62), "", "",
     "under srun the master port is 29500 + job id % 1000", "LaunchEnv::masterPort",
     "initProcessGroup"},
    {"OMPI_COMM_WORLD_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "rank under Open MPI's mpirun (read when RANK and SLURM_PROCID are unset)", "LaunchEnv::rank",
     "initProcessGroup, bench programs"},
    {"OMPI_COMM_WORLD_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "world size under mpirun", "LaunchEnv::worldSize", "initProcessGroup, bench programs"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "local rank under mpirun", "LaunchEnv::localRank", "initProcessGroup"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "local world size under mpirun", "LaunchEnv::localWorldSize", "initProcessGroup"},
    {"PMI_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "rank under other MPI launchers (bench programs only, to print usage once)", "",
     "bench programs"},
    {"PMI_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "world size under other MPI launchers (gloo_bench only)", "", "bench programs"},

    {"GROUP_RANK", K::kInteger, S::kLaunch, "", 0, (1LL << 31) - 1, "", "",
     "loom-run sets it to the node rank (torchrun's name)", "", "set by loom-run"},
    {"GROUP_WORLD_SIZE", K::kInteger, S::kLaunch, "", 1, (1LL << 31) - 1, "", "",
     "loom-run sets it to the number of nodes (torchrun's name; elastic: this round's)", "",
     "set by loom-run"},
    {"LOOM_RUN_ID", K::kText, S::kLaunch, "", 0, 0, "", "",
     "loom-run --run-id, for the training program; the libraries do not read it", "",
     "set by loom-run"},
    {"LOOM_RESTART_COUNT", K::kInteger, S::kLaunch, "0", 0, (1LL << 31) - 1, "", "",
     "0, then 1, 2, ... per loom-run restart (elastic --nnodes MIN:MAX: the rendezvous round, "
     "the same on every node), for the training program; above 0 the trace file of LOOM_TRACE "
     "is loom-trace-rank<r>-restart<k>.json, so that a restart keeps the failed attempt's",
     "", "set by loom-run; read by the trace"},
    {"TORCHELASTIC_RESTART_COUNT", K::kInteger, S::kLaunch, "0", 0, (1LL << 31) - 1, "", "",
     "torchrun's restart count, read as LOOM_RESTART_COUNT when that is unset or 0", "",
     "set by torchrun; read by the trace"},
    {"LOOM_MAX_RESTARTS", K::kInteger, S::kLaunch, "0", 0, (1LL << 31) - 1, "", "",
     "loom-run --max-restarts, for the training program", "", "set by loom-run"},
    {"LOOM_AGENT_STORE", K::kFlag, S::kLaunch, "0", 0, 0, "", "",
     "1: the launcher hosts the TCPStore at MASTER_ADDR:MASTER_PORT (loom-run does with "
     "--on-worker-failure continue), so every rank, rank 0 included, is a client and the store "
     "outlives any rank",
     "", "set by loom-run"},
    {"LOOM_RUN_ON_WORKER_FAILURE", K::kChoice, S::kLaunch, "stop", 0, 0, "stop|continue", "",
     "loom-run --on-worker-failure: whether the other workers keep running when one fails "
     "(loom-train --shrink-on-failure warns when it is not continue)",
     "", "set by loom-run"},

    // ---- read, not Loom's; and test-only ----
    {"PATH", K::kText, S::kOther, "", 0, 0, "", "",
     "where loom-run and spawn look for a program named without a '/'", "", "loom-run"},
    {"OPENBLAS_CORETYPE", K::kText, S::kOther, "", 0, 0, "", "",
     "OpenBLAS's kernel set (Haswell, SkylakeX, ...), read by OpenBLAS when it loads; when set, "
     "loom-train keeps it; unset, loom-train switches a generic set OpenBLAS picked for a CPU "
     "model it does not know (Prescott, ...) to the best one the CPU runs",
     "loom::ag::setGenericKernels", "loom-train start"},
    {"CUDA_VISIBLE_DEVICES", K::kText, S::kOther, "", 0, 0, "", "",
     "the CUDA devices this process sees, read by CUDA; Loom names its value when the nccl "
     "backend finds no device",
     "nccl backend", "nccl group creation without a device"},
    {"XDG_CACHE_HOME", K::kText, S::kOther, "", 0, 0, "", "",
     "where the per-host tuning cache lives (XDG_CACHE_HOME/loom) when LOOM_TUNING_CACHE is "
     "unset",
     "", "Context setup, loom-bench --tune"},
    {"HOME", K::kText, S::kOther, "", 0, 0, "", "",
     "where the per-host tuning cache lives (HOME/.cache/loom) when neither LOOM_TUNING_CACHE "
     "nor XDG_CACHE_HOME is set",
     "", "Context setup, loom-bench --tune"},
    {"TMPDIR", K::kText, S::kOther, "/tmp", 0, 0, "", "",
     "where process tests make their temporary directories", "", "tests"},
    {"LOOM_TEST_HOST", K::kText, S::kOther, "", 0, 0, "", "",
     "tests/netns: the namespace a worker runs in", "", "tests"},
    {"LOOM_TEST_ADDR", K::kText, S::kOther, "", 0, 0, "", "",
     "tests/netns: the address a worker must listen on", "", "tests"},
};

}  // namespace

std::span<const Setting> table() {
  return kTable;
}

}  // namespace loom::settings
