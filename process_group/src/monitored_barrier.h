// The monitored barrier (c10d's monitored_barrier), through the group's store rather than the
// data path, so that it works whatever the backend and names who is missing.
//
// Contract
// - Blocking, on the thread that runs the operation; every rank of the group calls it with the
//   same sequence number (the group's collective seq).
// - Rank 0 collects: it waits for every other rank's arrival key until `op.timeout`, then
//   writes a release key: "ok", or the failure message naming the ranks that did not arrive
//   (the first one, or all of them when op.waitAllRanks). The other ranks set their arrival
//   key and wait for the release (a little longer than the timeout, so that rank 0's verdict
//   reaches them); they throw rank 0's message, or, when rank 0 never answers, a TimeoutError
//   naming rank 0.
// - Errors: TimeoutError as above; the store's own errors pass through.
// - Keys: "monitored_barrier/<seq>/..."; the last rank to read the release deletes the keys.
#pragma once

#include <string>

#include "loom/process_group/process_group.h"

namespace loom {

// `who` prefixes messages ("rank 2 of group/1").
void runMonitoredBarrier(Store& store, int rank, int size, const OpDesc& op,
                         const std::string& who);

}  // namespace loom
