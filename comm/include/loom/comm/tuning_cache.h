// Which tuning a group runs with (public, for loom-bench --tune and the Context): the built-in
// table computed from the topology the group sees, the per-host tuning cache that
// `loom-bench --tune` writes, or the file LOOM_TUNING_FILE names.
//
// Precedence, decided on rank 0 and used by every rank of the group (Context::create):
//   1. LOOM_TUNING_FILE (ContextOptions::tuningFile): a text tuning file (tuning.h) or a JSON
//      cache as below; unusable gives one warning and the built-in table.
//   2. The per-host cache, $XDG_CACHE_HOME/loom/tuning-<fingerprint>.json (else
//      $HOME/.cache/loom/...; LOOM_TUNING_CACHE names another directory, or "off"). The
//      fingerprint hashes the CPU model, the usable CPU count, the cache format and Loom's
//      version, so a cache measured on another machine or by another release is never picked.
//      Absent: the built-in table, silently; no section for the topology: the built-in table,
//      said in the summary; stale (another format or Loom version), foreign (another CPU model
//      or CPU count) or malformed: one warning and the built-in table.
//   3. The built-in table for the group's topology (builtinCrossovers(GroupTopology)).
//
// The cache file:
//   {"format": "loom-tuning-cache", "version": 1, "loom": "0.1.0",
//    "host": {"fingerprint": "...", "cpu_model": "...", "cpus": 16, "l2_bytes": ..., ...},
//    "sections": {"world=8 per_host=8 transport=shm": {"allreduce.rd_max": 131072, ...,
//                                                      "allreduce.rules": "0:rd 262144:ring"}}}
// Each section holds the names and values of a text tuning file's section (tuning.h), checked
// by the same parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/tuning.h"

namespace loom::comm {

// This machine as this process sees it (read once; thread-safe).
struct HostFacts {
  std::string cpuModel;  // /proc/cpuinfo "model name" ("unknown" when absent)
  int onlineCpus = 1;    // the machine's online CPUs (sysconf): part of the cache's fingerprint
  int cpus = 1;          // CPUs this process may run on (sched_getaffinity)
  std::string cpuMask;   // those CPUs, "0-3,8" (ranks of one host pool theirs)
  size_t l2Bytes = 0;    // one core's L2 (sysfs cpu0 cache; 0: unknown)
  size_t l3Bytes = 0;    // the L3 cpu0 shares (0: unknown)
};
const HostFacts& hostFacts();
// The CPUs in the union of `masks` ("0-3,8", as HostFacts::cpuMask); malformed parts count none.
int countCpus(const std::vector<std::string>& masks);

// What every rank of a group agrees on: computed at setup from every rank's host identity and
// HostFacts, the same on every rank.
struct GroupTopology {
  int worldSize = 1;
  int hosts = 1;
  int minPerHost = 1;             // ranks on the host that holds the fewest
  int maxPerHost = 1;             // ranks on the host that holds the most
  std::string transport = "tcp";  // "tcp", "shm" (one host) or "shm+tcp"
  int minCpus = 1;  // the fewest CPUs the ranks of one host may run on together (their affinity)
  size_t minL2Bytes = 0;  // the smallest L2 of any rank (0: unknown somewhere)
  // The section a tuning file keys this topology by: "world=4 per_host=2 transport=shm+tcp",
  // with "per_host=1-3" when hosts hold different numbers of ranks.
  std::string key() const;
  // "4 ranks on 2 hosts (1-3 per host), 2 CPUs, 1 MiB L2", for logs.
  std::string describe() const;
};

// The built-in table for `topology`. The rule (docs/bench.md, "Tuning"): the crossovers
// measured on the 2-core development VM, with the recursive-doubling all-reduce's range set by
// whether every rank has a core of its own: 128 KiB when no host holds more ranks than the CPUs
// its ranks may run on together (minCpus) (measured: 2 ranks on 2 cores), 256 KiB when some host is
// oversubscribed (latency then dominates; measured: 3 and 4 ranks on 2 cores); halving-doubling
// up to 32 MiB for power-of-two worlds from 4; tree broadcast and direct all-gather and
// reduce-scatter up to 64 KiB per rank; the single copy never. The cache sizes are agreed and
// logged but move no crossover: nothing measured yet ties one to them.
Crossovers builtinCrossovers(const GroupTopology& topology);

// The cache's format version; a cache with another is stale.
constexpr int kTuningCacheVersion = 1;
// 16 hex digits naming this machine's caches (CPU model, CPU count, format, Loom version).
std::string hostFingerprint(const HostFacts& facts);
// The cache directory: `configured` (LOOM_TUNING_CACHE) when set, else $XDG_CACHE_HOME/loom,
// else $HOME/.cache/loom; "" when `configured` is "off" or no directory is known.
std::string tuningCacheDirectory(const std::string& configured);
// `directory`/tuning-<fingerprint>.json
std::string tuningCachePath(const std::string& directory, const HostFacts& facts);

// Section `key` of the cache at `path`; nullopt with `why` set when the file cannot be used,
// with `noSection` set when only the section is missing (not worth a warning).
std::optional<Crossovers> loadTuningCache(const std::string& path, const std::string& key,
                                          const HostFacts& facts, std::string& why,
                                          bool& noSection);
// Writes section `key` into the cache at `path` (creating its directory; keeping the other
// sections of a usable cache of this host, replacing anything else), atomically (a temporary
// file renamed). Throws IoError naming the path when it cannot.
void writeTuningCache(const std::string& path, const std::string& key, const Crossovers& x,
                      const HostFacts& facts);

// The tuning a rank would run with on its own (before the group agrees on rank 0's).
struct TuningChoice {
  Crossovers crossovers;  // the table in force (the built-in one when !tuned)
  bool tuned = false;     // from a file or the cache
  std::string source;     // "built-in", "cache PATH", "LOOM_TUNING_FILE PATH", with notes
  std::string warning;    // non-empty: the one warning this choice deserves
  std::string digest;     // 16 hex digits of the table in force: equal tables, equal digests
};
// `tuningFile` (LOOM_TUNING_FILE) first, then the cache in `cacheDirectory` (may be ""), then
// the built-in table for `topology`.
TuningChoice chooseTuning(const std::string& tuningFile, const std::string& cacheDirectory,
                          const GroupTopology& topology, const HostFacts& facts);

// 16 hex digits of section `key` holding `x` (formatTuning), the same on every machine.
std::string tuningDigest(const std::string& key, const Crossovers& x);

}  // namespace loom::comm
