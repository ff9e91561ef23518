// The Context implementation: a transport to every peer, scratch memory for the algorithms and
// the collective engines (engine/engine.h). The transport is tcp with one socket per peer; with
// sharedMemory on, peers on this host are reached through a shared-memory transport instead
// (shm/routing_transport.h). The engines are chosen here, once: the arena engine when every rank
// is on this host, the hierarchical engine when hosts hold several ranks each, and always the
// generic engine for the rest.
#include "loom/comm/context.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "context_settings.h"
#include "engine/engine.h"
#include "engine/engines.h"
#include "loom/comm/reduce.h"
#include "loom/comm/transport.h"
#include "loom/comm/tuning_cache.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/setup_failure.h"
#include "loom/store/store.h"
#include "shm/hierarchy.h"
#include "shm/routing_transport.h"
#include "shm/shm.h"
#include "shm/shm_transport.h"
#include "tcp/tcp_transport.h"

namespace loom::comm {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// What setupSharedMemory found: the arena (the Context's when every rank is on this host, this
// host's when hierarchical) goes to the engine that runs on it; the rest stays for the summary.
struct SharedMemory {
  std::unique_ptr<shm::Arena> arena;
  std::unique_ptr<shm::ShmTransport> p2p;  // to the other ranks of this host
  bool singleHost = false;
  bool hierarchical = false;
  int localRanks = 1;  // ranks on this rank's host (this one included)
  shm::Hierarchy hierarchy;
};

class ContextImpl : public Context {
 public:
  ContextImpl(int rank, int size, std::unique_ptr<Transport> transport, SharedMemory shared,
              const GenericEngineOptions& genericOptions)
      : rank_(rank),
        size_(size),
        singleHost_(shared.singleHost),
        hierarchical_(shared.hierarchical),
        localRanks_(shared.localRanks),
        hosts_(static_cast<int>(shared.hierarchy.leaders.size())) {
    // Same-host peers get point-to-point over shared memory, the others keep tcp.
    if (shared.p2p) {
      transport_ =
          std::make_unique<shm::RoutingTransport>(std::move(transport), std::move(shared.p2p));
      shmPointToPoint_ = true;
    } else {
      transport_ = std::move(transport);
    }
    if (shared.arena) shared.arena->setTransport(transport_.get());
    std::unique_ptr<Engine> local;
    if (shared.singleHost) {
      local = makeArenaEngine(std::move(shared.arena));
    } else if (shared.hierarchical) {
      local = makeHierarchicalEngine(std::move(shared.hierarchy), std::move(shared.arena));
    }
    setEngines(std::make_unique<EngineSet>(makeGenericEngine(genericOptions), std::move(local),
                                           genericOptions.algorithm));
  }
  // The engines go first: the arena is unmapped before the sockets close.
  ~ContextImpl() override { releaseEngines(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void abort(const std::string& reason) override {
    const std::string message = detail::str("rank ", rank_, ": context aborted: ", reason);
    engines()->abort(rank_, message);
    transport_->abort(message);
  }
  std::string transportSummary() const override {
    if (size_ == 1) return "none (world size 1)";
    const char* p2p = shmPointToPoint_ ? "" : ", tcp point-to-point";
    if (singleHost_) {
      return detail::str("shm (all ", size_, " ranks on this host", p2p, ")");
    }
    if (hierarchical_ && localRanks_ == 1) {
      return detail::str("tcp (alone on this host; shm within the other hosts of ", hosts_, ")");
    }
    if (hierarchical_) {
      return detail::str("shm within hosts (", localRanks_, " of ", size_, " ranks on this host",
                         p2p, "), tcp between ", hosts_, " hosts");
    }
    return "tcp";
  }
  Transport& transport() override { return *transport_; }

  void* scratch(size_t bytes, int slot) override {
    LOOM_CHECK(slot >= 0 && slot < kSlots, "scratch slot ", slot, " out of range");
    Buffer& b = scratch_[slot];
    if (b.bytes < bytes || !b.data) {
      const size_t rounded = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr) LOOM_THROW(IoError, "cannot allocate ", rounded, " bytes of scratch");
      b.data.reset(p);
      b.bytes = rounded;
    }
    return b.data.get();
  }

 private:
  static constexpr int kSlots = 4;
  struct Buffer {
    std::unique_ptr<void, FreeDeleter> data;
    size_t bytes = 0;
  };
  const int rank_;
  const int size_;
  const bool singleHost_;
  const bool hierarchical_;
  const int localRanks_;
  const int hosts_;  // hosts of a hierarchical Context
  std::unique_ptr<Transport> transport_;
  bool shmPointToPoint_ = false;  // same-host point-to-point goes over shm
  std::array<Buffer, kSlots> scratch_;
};

// A wait of the setup steps after the tcp transport's: a rank that failed there (a second
// process with its rank refused while this one was connecting: loom/store/rank_claim.h) said why
// under the transport's failure key, and this rank stops naming it instead of timing out.
void waitAfterTcp(Store& store, const std::vector<std::string>& keys, int rank,
                  const ContextOptions& options) {
  waitWatchingSetup(store, keys, Deadline(options.timeout),
                    options.storePrefix + "/tcp/setup-failed",
                    detail::str("rank ", rank, ": context setup stopped"));
}

// Same-host ranks get a shared-memory arena and a shared-memory transport. Every rank publishes its
// host identity (or "off" when shared memory is disabled on it) so that all ranks take the same
// decision: one arena for the whole Context when all ranks share a host; one arena per host (for
// the hierarchical all-reduce) when the ranks span several hosts; none when any rank is off.
SharedMemory setupSharedMemory(Store& store, int rank, int size, const ContextOptions& options) {
  SharedMemory shared;
  if (size < 2) return shared;
  const bool enabled = options.sharedMemory;
  const std::string prefix = options.storePrefix + "/shm";
  store.set(detail::str(prefix, "/host/", rank),
            enabled ? shm::hostIdentity(options.shmHostId) : "off");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::str(prefix, "/host/", r));
  waitAfterTcp(store, keys, rank, options);
  const std::vector<Bytes> hosts = store.multiGet(keys);
  std::vector<int> local;  // the ranks on this rank's host, in increasing order
  for (int r = 0; r < size; ++r) {
    if (toString(hosts[r]) == "off") return shared;
    if (hosts[r] == hosts[rank]) local.push_back(r);
  }
  shm::ArenaOptions aopts;
  aopts.timeout = options.timeout;
  aopts.slotBytes = options.shmSlotBytes;
  aopts.memfd = options.shmMemfd;
  aopts.spinUs = options.shmSpinUs;
  aopts.yieldUs = options.shmYieldUs;
  aopts.singleCopy = options.shmSingleCopy;
  aopts.windows = options.shmWindows;
  aopts.windowMinBytes = options.shmWindowMinBytes;
  aopts.foldSkew = options.shmFoldSkew;
  aopts.copyThreads = options.shmCopyThreads;
  shm::ShmTransportOptions topts;
  topts.timeout = options.timeout;
  topts.ringBytes = options.shmRingBytes;
  topts.memfd = options.shmMemfd;
  topts.spinUs = options.shmSpinUs;
  topts.yieldUs = options.shmYieldUs;
  shared.localRanks = static_cast<int>(local.size());
  const bool p2p = local.size() > 1 && options.shmPointToPoint;
  if (static_cast<int>(local.size()) == size) {
    aopts.keyPrefix = prefix;
    shared.arena = shm::Arena::create(store, rank, size, aopts);
    shared.singleHost = true;
    topts.keyPrefix = prefix + "/p2p";
    if (p2p) shared.p2p = shm::ShmTransport::create(store, rank, size, local, topts);
    return shared;
  }
  bool anyShared = false;
  for (int r = 0; r < size; ++r) {
    bool first = true, several = false;
    for (int q = 0; q < size; ++q) {
      if (hosts[q] == hosts[r] && q < r) first = false;
      if (hosts[q] == hosts[r] && q != r) several = true;
    }
    if (first) shared.hierarchy.leaders.push_back(r);
    anyShared = anyShared || several;
  }
  if (!anyShared) return shared;  // one rank per host: plain tcp
  shared.hierarchical = true;
  if (local.front() == rank) {
    for (size_t h = 0; h < shared.hierarchy.leaders.size(); ++h) {
      if (shared.hierarchy.leaders[h] == rank) shared.hierarchy.leaderIndex = static_cast<int>(h);
    }
  }
  if (local.size() > 1) {
    const int localRank =
        static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
    aopts.keyPrefix = detail::str(prefix, "/host-of-", local.front());
    shared.arena = shm::Arena::create(store, localRank, static_cast<int>(local.size()), aopts);
    topts.keyPrefix = detail::str(prefix, "/p2p-of-", local.front());
    if (p2p) shared.p2p = shm::ShmTransport::create(store, rank, size, local, topts);
  }
  return shared;
}

// The tuning every rank of the group runs with (loom/comm/tuning_cache.h), agreed at setup so
// that every rank takes the same section and the same algorithm for the same call.
struct AgreedTuning {
  std::string key;  // the section (GroupTopology::key)
  Crossovers crossovers;
  bool tuned = false;   // from a file or the cache, not the built-in table
  std::string summary;  // Context::tuning()
};

// One warning per message per process: many groups read the same unusable cache.
void warnOnce(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> given;
  std::lock_guard<std::mutex> lock(mu);
  if (given.insert(message).second) LOOM_LOG_WARNING(message);
}

std::vector<std::string> splitLines(const std::string& text, size_t fields) {
  std::vector<std::string> out;
  size_t at = 0;
  while (out.size() + 1 < fields) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  out.push_back(text.substr(std::min(at, text.size())));
  out.resize(fields);
  return out;
}

// Two rounds through the store. First every rank publishes its host identity (whether or not
// shared memory is on), the CPUs it may run on and its L2 size, from which every rank computes the
// same GroupTopology. Then every rank publishes the digest and source of the tuning it would take
// on its own, and rank 0 its table too: every rank runs rank 0's, and a rank whose own differs is
// named (once, by rank 0).
AgreedTuning agreeOnTuning(Store& store, int rank, int size, const ContextOptions& options,
                           const SharedMemory& shared) {
  const HostFacts& facts = hostFacts();
  const std::string prefix = options.storePrefix + "/topology/";
  store.set(
      detail::str(prefix, "host/", rank),
      detail::str(shm::hostIdentity(options.shmHostId), "\n", facts.cpuMask, "\n", facts.l2Bytes));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::str(prefix, "host/", r));
  waitAfterTcp(store, keys, rank, options);
  const std::vector<Bytes> published = store.multiGet(keys);
  GroupTopology topology;
  topology.worldSize = size;
  topology.transport = shared.singleHost ? "shm" : shared.hierarchical ? "shm+tcp" : "tcp";
  std::map<std::string, int> perHost;
  std::map<std::string, std::vector<std::string>> masks;  // each host's ranks' CPUs
  topology.minL2Bytes = facts.l2Bytes;
  for (int r = 0; r < size; ++r) {
    const std::vector<std::string> f = splitLines(toString(published[r]), 3);
    ++perHost[f[0]];
    masks[f[0]].push_back(f[1]);
    topology.minL2Bytes =
        std::min<size_t>(topology.minL2Bytes, std::strtoull(f[2].c_str(), nullptr, 10));
  }
  // Ranks pinned to a core each still have a core each: a host's CPUs are its ranks' together.
  topology.minCpus = std::numeric_limits<int>::max();
  for (const auto& [host, list] : masks) {
    topology.minCpus = std::min(topology.minCpus, std::max(1, countCpus(list)));
  }
  topology.hosts = static_cast<int>(perHost.size());
  topology.minPerHost = size;
  topology.maxPerHost = 0;
  for (const auto& [host, count] : perHost) {
    topology.minPerHost = std::min(topology.minPerHost, count);
    topology.maxPerHost = std::max(topology.maxPerHost, count);
  }
  AgreedTuning agreed;
  agreed.key = topology.key();
  const TuningChoice mine =
      chooseTuning(options.tuningFile, tuningCacheDirectory(options.tuningCache), topology, facts);
  if (rank == 0 && !mine.warning.empty()) warnOnce(mine.warning);
  std::string source = mine.source;  // one line (a path may hold anything)
  std::replace(source.begin(), source.end(), '\n', ' ');
  store.set(detail::str(prefix, "tuning/", rank),
            detail::str(mine.digest, "\n", source, "\n", int{mine.tuned}, "\n",
                        rank == 0 ? formatTuning(agreed.key, mine.crossovers, true) : ""));
  keys.clear();
  for (int r = 0; r < size; ++r) keys.push_back(detail::str(prefix, "tuning/", r));
  waitAfterTcp(store, keys, rank, options);
  const std::vector<Bytes> choices = store.multiGet(keys);
  const std::vector<std::string> first = splitLines(toString(choices[0]), 4);
  std::string why;
  const auto table = parseTuning(first[3], "rank 0's tuning", agreed.key, why);
  LOOM_CHECK(table.has_value(), "rank ", rank, ": cannot read rank 0's tuning table: ", why);
  agreed.crossovers = *table;
  agreed.tuned = first[2] == "1";
  agreed.summary =
      first[1] == "built-in" ? detail::str("built-in (", topology.describe(), ")") : first[1];
  agreed.summary += detail::str(" [", agreed.key, "]");
  std::string differ;
  for (int r = 1; r < size; ++r) {
    const std::vector<std::string> theirs = splitLines(toString(choices[r]), 3);
    if (theirs[0] == first[0]) continue;
    differ += detail::str(differ.empty() ? "" : "; ", "rank ", r, " has ", theirs[1], " (table ",
                          theirs[0], ")");
  }
  if (!differ.empty()) {
    agreed.summary +=
        detail::str("; every rank uses rank 0's (table ", first[0], ") though ", differ);
    if (rank == 0) {
      warnOnce(detail::str("tuning differs between ranks: rank 0 has ", first[1], " (table ",
                           first[0], "), ", differ, "; every rank uses rank 0's [", agreed.key,
                           "] (give every rank the same LOOM_TUNING_FILE, or run loom-bench "
                           "--tune on every host)"));
    }
  }
  return agreed;
}

}  // namespace

namespace {

// Once per process and algorithm: which collectives a forced algorithm (LOOM_ALGO) runs, and
// which keep their automatic choice, which it cannot run.
void logForcedAlgorithm(Algorithm forced) {
  if (forced == Algorithm::kAuto) return;
  static std::mutex mu;
  static std::set<Algorithm> told;
  std::lock_guard<std::mutex> lock(mu);
  if (!told.insert(forced).second) return;
  std::string runs, keeps;
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kReduce, OpType::kAllgather,
                    OpType::kReduceScatter, OpType::kGather, OpType::kScatter, OpType::kAlltoall}) {
    std::string& list = implementsAlgorithm(op, forced) ? runs : keeps;
    list += detail::str(list.empty() ? "" : ", ", opTypeName(op));
  }
  if (keeps.empty()) return;
  LOOM_LOG_WARNING("algorithm ", algorithmName(forced),
                   " is forced (LOOM_ALGO / "
                   "ContextOptions::algorithm) for ",
                   runs.empty() ? "no collective" : runs, "; ", keeps,
                   " do not have it and keep their automatic choice");
}

}  // namespace

std::shared_ptr<Context> Context::create(Store& store, int rank, int size,
                                         const ContextOptions& callerOptions) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  // The environment is applied at every setup, so a bad value fails here, every time.
  const ContextOptions options = withEnvironment(callerOptions);
  validateOptions(options);
  setReduceIsa(options.reduceIsa);
  logForcedAlgorithm(options.algorithm);
  GenericEngineOptions generic;
  generic.algorithm = options.algorithm;
  generic.chunkBytes = options.chunkBytes;
  tcp::TcpOptions topts;
  topts.timeout = options.timeout;
  topts.host = options.host;
  topts.keyPrefix = options.storePrefix + "/tcp";
  topts.bufferBytes = options.socketBufferBytes;
  topts.busyPollUs = options.busyPollUs;
  topts.sendBytes = options.tcpSendBytes;
  topts.spinUs = options.tcpSpinUs;
  topts.sockets = options.tcpSockets;
  topts.reconnectMs = options.tcpReconnectMs;
  topts.healLocal = options.tcpHealLocal;
  auto transport = tcp::TcpTransport::create(store, rank, size, topts);
  SharedMemory shared = setupSharedMemory(store, rank, size, options);
  AgreedTuning tuning = agreeOnTuning(store, rank, size, options, shared);
  generic.crossovers = tuning.crossovers;
  if (tuning.tuned && shared.arena) shared.arena->setCrossMemoryRanges(tuning.crossovers);
  const bool crossMemory = shared.arena && shared.arena->singleCopy();
  auto ctx =
      std::make_shared<ContextImpl>(rank, size, std::move(transport), std::move(shared), generic);
  static_cast<Context&>(*ctx).topology_ = tuning.key;
  static_cast<Context&>(*ctx).tuning_ = std::move(tuning.summary);
  static_cast<Context&>(*ctx).crossMemory_ = crossMemory;
  static_cast<Context&>(*ctx).reproducible_ = options.reproducible;
  static_cast<Context&>(*ctx).timeout_ = options.timeout;
  return ctx;
}

Context::Context() = default;
Context::~Context() = default;

void Context::setEngines(std::unique_ptr<EngineSet> engines) {
  engines_ = std::move(engines);
}

void Context::releaseEngines() noexcept {
  engines_.reset();
}

}  // namespace loom::comm
