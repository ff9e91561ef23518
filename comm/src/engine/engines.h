// The concrete collective engines (engine.h), made by the Context factories: the generic
// engine over any Transport, and the two shared-memory engines over an Arena.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "engine/engine.h"
#include "loom/comm/collectives.h"
#include "loom/comm/tuning.h"
#include "shm/hierarchy.h"

namespace loom::comm {

namespace shm {
class Arena;
}

struct GenericEngineOptions {
  // Forces one algorithm where the operation implements it (ContextOptions::algorithm); the
  // others keep the automatic choice.
  Algorithm algorithm = Algorithm::kAuto;
  // Message size of the chunked, pipelined algorithms (ContextOptions::chunkBytes).
  size_t chunkBytes = size_t{512} << 10;
  // The automatic choice's crossovers from a tuning file (ContextOptions::tuningFile); empty:
  // the built-in table.
  std::optional<Crossovers> crossovers;
};

// The algorithms of comm/src/algorithms over the Context's transport; every collective.
std::unique_ptr<Engine> makeGenericEngine(const GenericEngineOptions& options);

// The shared-memory collectives (shm/shm_collectives.h) over `arena`, which spans every rank
// of the Context; every collective.
std::unique_ptr<Engine> makeArenaEngine(std::unique_ptr<shm::Arena> arena);

// The hierarchical all-reduce (shm/hierarchy.h); `hostArena` spans this host's ranks (null when
// this rank is alone on its host). Only all-reduce: the rest runs on the generic engine.
std::unique_ptr<Engine> makeHierarchicalEngine(shm::Hierarchy hierarchy,
                                               std::unique_ptr<shm::Arena> hostArena);

}  // namespace loom::comm
