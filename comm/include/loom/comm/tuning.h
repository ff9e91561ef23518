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
// reduce-scatter). A Context loads the section of its own topology (ContextOptions::tuningFile);
// a missing or unreadable file, a malformed line, another version or no section for the
// topology gives one warning (rank 0) and the built-in table.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace loom::comm {

struct Crossovers {
  size_t allreduceRdMax = 0;
  size_t allreduceHdMax = 0;
  size_t broadcastTreeMax = 0;
  size_t gatherDirectMax = 0;
};

// The built-in table for `worldSize` ranks (measured on the 2-core dev VM; select.cc).
Crossovers builtinCrossovers(int worldSize);

// "world=2 per_host=2 transport=tcp"
std::string topologyKey(int worldSize, int ranksPerHost, const std::string& transport);

// The crossovers of section `key` of the tuning file at `path`; nullopt with `why` set (the
// file, the line and what was expected) when the file cannot be used.
std::optional<Crossovers> loadTuning(const std::string& path, const std::string& key,
                                     std::string& why);

// One section of a tuning file, with the version line when `header`.
std::string formatTuning(const std::string& key, const Crossovers& crossovers, bool header);

}  // namespace loom::comm
