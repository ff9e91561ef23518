// Context: one rank's connected membership in a communicator: its rank, the world size, and
// a transport to each peer an algorithm needs, set up through a Store.
//
// Contract
// - Context::create is collective: every rank calls it with the same store (or a store with
//   the same prefix) and its own rank; it returns once this rank is connected, or throws
//   TimeoutError naming the ranks that never published their address.
// - A Context is used by one thread at a time (the ProcessGroup's worker thread); abort()
//   may be called from any thread and makes blocked and future operations fail fast with
//   IoError.
// - A Context owns its collective engines, chosen once at creation (the shared-memory arena,
//   the hierarchical engine or the generic algorithms over its transport); collectives.h
//   dispatches every call to one of them.
// - The destructor closes every connection and never throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/comm/collectives.h"
#include "loom/comm/reduce.h"

namespace loom {
class Store;
}

namespace loom::comm {

// The RDMA verbs transport's settings (createVerbsContext, loom/comm/verbs.h).
struct VerbsOptions {
  // Device name; empty = LOOM_IB_DEVICE when set, else the first device.
  std::string device;
  // Device port, in [1, 255] (LOOM_IB_PORT).
  int port = 1;
  // GID table index (RoCE), in [0, 65535] (LOOM_IB_GID_INDEX).
  int gidIndex = 0;
  // Slots in each peer's receive ring, in [2, 4096]; equal on all ranks (LOOM_IB_SLOTS).
  int slots = 16;
  // Bytes per slot, header included, in [256, 64 MiB]; equal on all ranks (LOOM_IB_SLOT_BYTES).
  size_t slotBytes = 64 << 10;
};

// ContextOptions::shmSingleCopy: whether shared memory reads peers' buffers directly.
enum class ShmSingleCopy { kAuto, kOn, kOff };

// Every field has a default; Context::create (and createVerbsContext) fills a field the caller
// left at its default from the environment variable named beside it, when that is set
// (loom/common/settings.h: `options.sharedMemory = false` beats LOOM_SHM=1, LOOM_SHM=0 turns a
// default off). Nothing below the factories reads the environment.
struct ContextOptions {
  // Connection setup and default collective deadline.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Address this rank listens on for peers; empty = LOOM_HOST when set, else the hostname's
  // address (127.0.0.1 with a warning when that cannot be listened on). An address given here
  // or in LOOM_HOST that cannot be listened on is an IoError.
  std::string host;
  // Same-host peers use shared memory when available (LOOM_SHM).
  bool sharedMemory = true;
  // Store keys are "<storePrefix>/..."; every Context on one Store needs its own prefix
  // (or a PrefixStore), and the keys of an old Context must not be reused.
  std::string storePrefix = "comm";
  // SO_SNDBUF/SO_RCVBUF per socket; 0 takes the default (LOOM_TCP_BUFFER_BYTES if set, else the
  // kernel's autotuning); a negative value forces autotuning, which on Linux grows the receive
  // buffer up to net.ipv4.tcp_rmem's maximum (32 MiB on the dev VM), more than an explicit size
  // may (capped by net.core.rmem_max, 4 MiB there).
  int socketBufferBytes = 0;
  // How long (µs) a thread waiting on a TCP transfer keeps polling the sockets without
  // blocking after bytes last moved, yielding the core between passes: < 0 the default
  // (LOOM_TCP_BUSY_US if set, else 1000); 0 blocks in poll() at once (less CPU, more latency
  // and lower bandwidth where wake-ups are slow, as on VMs). At most 10 s.
  int busyPollUs = -1;

  // Forces one generic algorithm for every collective that implements it (LOOM_ALGO), over
  // the transport (the shared-memory engines are bypassed for those); the other collectives keep
  // their automatic choice, and Context::create says once which those are. kAuto: the automatic
  // choice.
  Algorithm algorithm = Algorithm::kAuto;
  // Message size of the chunked, pipelined algorithms (ring, halving-doubling, chain), in
  // [4 KiB, 1 GiB] (LOOM_CHUNK_BYTES).
  size_t chunkBytes = size_t{512} << 10;
  // The reduce kernels' instruction set (LOOM_REDUCE_ISA); process-wide.
  ReduceIsa reduceIsa = ReduceIsa::kAuto;
  // Bytes handed to one sendmsg call, in [4 KiB, 1 GiB] (LOOM_TCP_SEND_BYTES).
  size_t tcpSendBytes = size_t{512} << 10;
  // How long (µs) a wait on a small (<= 64 KiB) tcp message spins before it drives the
  // sockets, in [0, 10 s] (LOOM_SPIN_US).
  int tcpSpinUs = 50;
  // TCP connections per peer pair, in [1, 16]; messages of 256 KiB and more are striped across
  // them. Equal on all ranks (LOOM_TCP_SOCKETS).
  int tcpSockets = 1;
  // How long a lost TCP connection to a live peer (reset, closed, a link down for a while) may
  // take to be re-established before the transport fails, in ms, in [0, 1 h]; what the peer had
  // not read is sent again. 0: a lost connection fails at once. A dead peer (its listener
  // refuses) fails at once either way. Zero on all ranks or on none (LOOM_TCP_RECONNECT_MS;
  // docs/heal.md).
  int tcpReconnectMs = 10000;
  // Whether TCP connections between two ranks of one host heal too (they keep a copy of what
  // they send for a resend, which costs; LOOM_TCP_HEAL_LOCAL). Equal on all ranks.
  bool tcpHealLocal = false;
  // Shared-memory point-to-point; false keeps send/recv on tcp while the collectives use the
  // arena (LOOM_SHM_P2P).
  bool shmPointToPoint = true;
  // Replaces the host identity that decides which ranks share memory; empty: the real one
  // (boot id, host name, namespaces). Tests split one machine into hosts with it
  // (LOOM_SHM_HOST_ID).
  std::string shmHostId;
  // false skips the anonymous memfd and uses the named-segment fallback (LOOM_SHM_MEMFD).
  bool shmMemfd = true;
  // Bytes of each arena staging slot, in [4 KiB, 1 GiB], rounded up to 4 KiB; 0: 2 MiB up to 4
  // ranks, else 1 MiB. Equal on all ranks (LOOM_SHM_SLOT_BYTES).
  size_t shmSlotBytes = 0;
  // Bytes of each shared-memory point-to-point ring, in [4 KiB, 1 GiB], rounded up to 4 KiB;
  // 0: 1 MiB up to 4 local ranks, else 256 KiB. Equal on all ranks (LOOM_SHM_RING_BYTES).
  size_t shmRingBytes = 0;
  // How long (µs) a shared-memory waiter spins, then yields, before it sleeps on a futex, each
  // in [0, 10 s]; < 0: 1000 and 1000, or 0 and 2000 when local ranks outnumber CPUs
  // (LOOM_SHM_SPIN_US, LOOM_SHM_YIELD_US).
  int shmSpinUs = -1;
  int shmYieldUs = -1;
  // The shared-memory reductions fold each element in rank order either way (one summation
  // order, the same bits). false (default): every rank reads its peers block after block in
  // rank order; true: skewed and rotated per rank, so that the reducers do not all pull from
  // one rank's memory at once (comm/src/shm/fold.h). Measured on 16 cores (docs/shm.md) the
  // rotation did not pay: rank order was 0-40% faster at 8 and 16 ranks and even at 4, and on
  // one core the rotation costs up to 20%; kept to A/B it on other machines. Need not be equal
  // on all ranks (LOOM_SHM_FOLD_SKEW).
  bool shmFoldSkew = false;
  // Helper threads per rank that share the staged all-reduce's copy in, fold of its own
  // sub-slice and copy out, each a contiguous range, for steps of 256 KiB or more (the same
  // bits: the fold is element-wise). 0 (default): none, every rank copies on its own thread;
  // N in [1, 64]: N helpers per rank, started on the first such step; -1 ("auto"): floor(CPUs
  // / local ranks) - 1 helpers when that is >= 1 (CPUs: the affinity mask). Not on by default
  // until measured on a many-core machine (docs/shm.md, "Helper threads"). Need not be equal
  // on all ranks (LOOM_SHM_COPY_THREADS).
  int shmCopyThreads = 0;
  // Single-copy shared memory: large all-reduce, reduce-scatter, broadcast and all-gather read
  // peers' buffers straight out of their processes (process_vm_readv) instead of copying
  // through the arena's slots. kAuto: where measured faster (on the 2-core dev VM: nowhere, so
  // staged), when a probe at setup succeeds on every rank (else every rank stays staged, said once
  // at info level); kOn: at every size (still only when the probe succeeds, a warning otherwise,
  // and only when every rank said kOn); kOff: never, on any rank, and no probe
  // (LOOM_SHM_SINGLE_COPY).
  ShmSingleCopy shmSingleCopy = ShmSingleCopy::kAuto;
  // Zero-copy windows (loom/comm/window.h): collectives whose buffers lie in Windows on every
  // rank read peers' memory directly, from shmWindowMinBytes up (nccl-tests' size; 0: measured
  // per operation, docs/shm.md), when a probe at setup maps a window on every rank; false on
  // any rank keeps every rank staged (LOOM_SHM_WINDOWS, LOOM_SHM_WINDOW_MIN_BYTES; equal on all
  // ranks).
  bool shmWindows = true;
  size_t shmWindowMinBytes = 0;
  // A tuning file written by `loom-bench --tune` (loom/comm/tuning.h): the automatic
  // algorithm choice takes its crossovers for this Context's topology (world size, ranks per
  // host, transport). Empty: the built-in table; a file that cannot be used gives one warning
  // and the built-in table (LOOM_TUNING_FILE).
  std::string tuningFile;
  // Reproducible mode for every all-reduce, reduce and reduce-scatter of this Context
  // (loom/comm/reproducible.h; CollectiveOptions::reproducible per call): SUM and AVG over
  // floating dtypes give the correctly rounded result, bitwise the same whatever the algorithm,
  // transport or tuning. Equal on all ranks (LOOM_REPRODUCIBLE).
  bool reproducible = false;
  // Where the per-host tuning cache of `loom-bench --tune` lives (loom/comm/tuning_cache.h):
  // empty: $XDG_CACHE_HOME/loom, else $HOME/.cache/loom; "off": no cache (LOOM_TUNING_CACHE).
  // Every group reads this host's cache there unless tuningFile is set.
  std::string tuningCache;
  // For createVerbsContext only.
  VerbsOptions verbs;
};

// "sharedMemory=0 chunkBytes=4096": every field that differs from its default (timeout and
// storePrefix included), for logs; "" when none does.
std::string describeNonDefault(const ContextOptions& options);

class Transport;
class EngineSet;  // comm-internal (comm/src/engine/engine.h)

class Context {
 public:
  static std::shared_ptr<Context> create(Store& store, int rank, int size,
                                         const ContextOptions& options = {});
  virtual ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Fail every blocked and future operation with IoError(reason); thread-safe.
  virtual void abort(const std::string& reason) = 0;
  // What carries this rank's data, for logs and benchmark headers: "tcp", "shm (all 4 ranks
  // on this host)", "shm within hosts (2 ranks on this host), tcp between 2 hosts", "verbs".
  // Fixed at creation; thread-safe.
  virtual std::string transportSummary() const = 0;

  // The transport the algorithms run over (collectives.h); owned by the Context.
  virtual Transport& transport() = 0;
  // Scratch memory for algorithms, at least `bytes` long, 64-byte aligned, kept between
  // calls; `slot` picks one of a few independent buffers. Valid until the next call with the
  // same slot. Only for the thread running collectives.
  virtual void* scratch(size_t bytes, int slot = 0) = 0;

  // The collective engines, for comm's own dispatch (collectives.cc); null for a Context
  // implemented outside comm, whose collectives then run the generic algorithms with default
  // settings. A plain member, not a virtual, so that dispatch costs no extra call.
  EngineSet* engines() const { return engines_.get(); }

  // The topology a tuning file keys its crossovers by (loom/comm/tuning.h: "world=2
  // per_host=2 transport=tcp", "per_host=1-3" when hosts hold different numbers of ranks),
  // the same on every rank; empty for Contexts that take no tuning file (verbs).
  const std::string& topology() const { return topology_; }
  // Which tuning every rank of this Context runs with, for logs: "built-in (4 ranks on 1 host
  // (4 per host), 2 CPUs, L2 1 MiB)", "cache PATH [KEY]", "LOOM_TUNING_FILE PATH [KEY]", and the
  // ranks whose own tuning differed from rank 0's, which every rank uses (tuning_cache.h); the
  // same on every rank; empty for Contexts that take no tuning (verbs).
  const std::string& tuning() const { return tuning_; }
  // Whether shared memory can read peers' buffers with one cross-memory copy (the setup probe
  // passed on every rank of this host; LOOM_SHM_SINGLE_COPY). Whether a collective does so
  // is the choice of LOOM_SHM_SINGLE_COPY=on or the tuning file (tuning.h).
  bool crossMemory() const { return crossMemory_; }
  // Whether every reduction runs in reproducible mode (ContextOptions::reproducible).
  bool reproducible() const { return reproducible_; }
  // The deadline of a collective whose CollectiveOptions::timeout is zero, the default
  // (ContextOptions::timeout, LOOM_TIMEOUT).
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  Context();
  // Called by an implementation's factory with ContextOptions::timeout (Context::create does).
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // Called once by the implementation's constructor, after its transport exists.
  void setEngines(std::unique_ptr<EngineSet> engines);
  // Destroys the engines now: an implementation whose engines use its transport calls this
  // first in its destructor (shared memory is unmapped before the sockets close).
  void releaseEngines() noexcept;

 private:
  std::unique_ptr<EngineSet> engines_;
  std::string topology_;
  std::string tuning_;
  bool crossMemory_ = false;
  bool reproducible_ = false;
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

}  // namespace loom::comm
