// Tuning (public, for loom-bench --tune): the size crossovers of the automatic algorithm choice
// (select.cc), built in or read from a tuning file that `loom-bench --tune FILE` measured on this
// machine.
//
// A tuning file holds one section per topology (world size, ranks per host, transport), since
// the crossovers move with all three:
//
//   # loom tuning v1
//   [world=2 per_host=2 transport=tcp]
//   allreduce.rd_max = 131072
//   allreduce.hd_max = 33554432
//   broadcast.tree_max = 65536
//   gather.direct_max = 65536
//
// Each value is the largest per-rank byte count at which the smaller-message algorithm still
// runs: recursive doubling before ring or halving-doubling, halving-doubling before ring
// (power-of-two worlds from 4), tree before chain, direct before ring (all-gather and
// reduce-scatter). A Context loads the section of its group's topology (ContextOptions::tuningFile,
// else this host's tuning cache: tuning_cache.h, which also says how every rank comes to run
// the same one); a missing or unreadable file, a malformed line, another version or no section
// for the topology gives one warning (rank 0) and the built-in table.
//
// Optional, for shared memory (a section whose transport is shm or shm+tcp):
//
//   allgather.cma_min = 65536
//   allgather.cma_max = 67108864
//
// (likewise allreduce., broadcast. and reduce_scatter.): the per-rank byte counts, both
// inclusive, at which the operation reads its peers' buffers with one cross-memory copy
// (process_vm_readv) instead of staging them through the arena, when the setup probe found
// cross-memory attach usable on every rank. Absent, or both 0: never (the built-in choice).
// The tuner writes them where the single copy was measured faster than staging by a margin.
//
// Optional, for any transport: a per-size choice, which decides the operation's algorithm when
// present (the crossovers above then only describe the same measurements):
//
//   broadcast.rules = 0:tree 131072:chain 1048576:tree
//
// (likewise allreduce., allgather. and reduce_scatter.): from each byte count per rank
// (inclusive) up to the next one, that algorithm. The first entry is at 0 and the counts rise;
// each algorithm is one the operation implements (allreduce: ring, rd, hd, direct; broadcast:
// tree, chain, direct; allgather and reduce_scatter: ring, direct). One crossover cannot say
// "the chain between 128 KiB and 1 MiB, the tree on both sides", which 4 ranks over loopback
// TCP on a 2-core VM measured; the tuner writes the winner of every size it measured.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"

namespace loom::comm {

// One entry of an operation's per-size choice: from `from` bytes per rank up to the next
// entry's `from`, run `algorithm`.
struct SizeRule {
  size_t from = 0;
  Algorithm algorithm = Algorithm::kAuto;
  bool operator==(const SizeRule& o) const { return from == o.from && algorithm == o.algorithm; }
};
using SizeRules = std::vector<SizeRule>;

// The algorithm `rules` give `bytes`; kAuto when there are none.
Algorithm ruleFor(const SizeRules& rules, size_t bytes);

// The per-rank byte counts [min, max] of one operation's cross-memory path (see above).
struct CrossMemoryRange {
  size_t min = 0;
  size_t max = 0;  // 0: never
  bool contains(size_t bytes) const { return max != 0 && bytes >= min && bytes <= max; }
  bool operator==(const CrossMemoryRange& o) const { return min == o.min && max == o.max; }
};

struct Crossovers {
  size_t allreduceRdMax = 0;
  size_t allreduceHdMax = 0;
  size_t broadcastTreeMax = 0;
  size_t gatherDirectMax = 0;
  // Shared memory's cross-memory single copy (optional in a file; empty: never).
  CrossMemoryRange allreduceCma;
  CrossMemoryRange broadcastCma;
  CrossMemoryRange allgatherCma;
  CrossMemoryRange reduceScatterCma;
  // Per-size choices (optional in a file; empty: the crossovers decide).
  SizeRules allreduceRules;
  SizeRules broadcastRules;
  SizeRules allgatherRules;
  SizeRules reduceScatterRules;
};

// The table measured on the 2-core dev VM for `worldSize` ranks (select.cc); a group runs
// builtinCrossovers(GroupTopology) (tuning_cache.h), which starts from it.
Crossovers builtinCrossovers(int worldSize);

// The automatic choice for collective `kind` with `bytes` per rank in a world of `worldSize`
// under `crossovers` (its rules first, then its crossovers), as a group makes it when no
// algorithm is forced.
Algorithm automaticAlgorithm(OpType kind, size_t bytes, int worldSize,
                             const Crossovers& crossovers);

// Whether `algorithm` is one collective `kind` implements (kAuto: no).
bool implementsAlgorithm(OpType kind, Algorithm algorithm);

// "world=2 per_host=2 transport=tcp"
std::string topologyKey(int worldSize, int ranksPerHost, const std::string& transport);

// The crossovers of section `key` of the tuning file at `path` (a text file as above, or a
// JSON per-host cache as below); nullopt with `why` set (the file, the line and what was
// expected) when the file cannot be used.
std::optional<Crossovers> loadTuning(const std::string& path, const std::string& key,
                                     std::string& why);
// The same for the text of a tuning file; `origin` names it in `why`.
std::optional<Crossovers> parseTuning(const std::string& text, const std::string& origin,
                                      const std::string& key, std::string& why);

// One section of a tuning file, with the version line when `header`.
std::string formatTuning(const std::string& key, const Crossovers& crossovers, bool header);

}  // namespace loom::comm
