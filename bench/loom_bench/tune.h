// loom-bench --tune [FILE]: measures this machine's algorithm crossovers for the job's topology
// and writes them into this host's tuning cache (loom/comm/tuning_cache.h), which every group on
// the host reads, or into the tuning file FILE (loom/comm/tuning.h; JSON when it ends in .json)
// that groups load with LOOM_TUNING_FILE.
#pragma once

#include <chrono>
#include <string>

namespace loom {
class Store;
}

namespace loom::bench {

// Runs on every rank of the job over a comm Context of its own on `store`; rank 0 writes
// `path`, or this host's tuning cache when `path` is empty (replacing the section of this
// topology, keeping the others). `maxBytes`: the largest
// per-rank size timed (from 4 KiB, x4). Returns the exit status.
int runTune(Store& store, int rank, int size, const std::string& path, size_t maxBytes,
            std::chrono::milliseconds timeout);

}  // namespace loom::bench
