// Claiming a rank of a group through its store, so that two processes started with the same
// rank (a launcher bug, a copied environment) are named when the group is created, instead of
// one of them joining in the other's place or both waiting for a group that cannot form.
//
// claimRank(store, key, rank, size): this process claims `rank` of a group of `size` ranks under
//   `key` (one key per rank of one group instance: "<group's prefix>/claim/<rank>"), with one
//   compareSet, so that one process holds it. Returns when the key was absent or already held
//   by this process (the same process creating the group again under the same keys); throws
//   InvalidArgumentError naming the rank and both processes when another process holds it:
//     "rank 1 of this group is claimed by two processes: host a, pid 123 (first) and host b,
//      pid 456 (refused); each process must have its own RANK (0..3) ..."
//   The caller publishes that error where the rest of its group watches (setup_failure.h), so
//   that the process holding the rank stops too.
// - A process is its host name, pid, boot id and start time (thisProcess()): two containers that
//   share a host name and a pid are still two processes, and a fork()ed child is another.
// - A claim is never released. Keys reused by another process (a worker restarted under the
//   same prefix of a store that outlived its group) read as a duplicate: such a group could not
//   form anyway (the peers would read the earlier group's addresses), so every group instance
//   needs its own store or prefix, as factory.h says. initProcessGroup, loom-run (a fresh store
//   per attempt and per elastic round), newGroup ("group/<id>"), shrinkGroup (a prefix per
//   attempt) and torch (a PrefixStore per group, a new store per rendezvous round) give it one.
// - Blocking: one store round trip. Thread-safe.
#pragma once

#include <string>

#include "loom/store/store.h"

namespace loom {

void claimRank(Store& store, const std::string& key, int rank, int size);

// What claimRank stores for this process: "host\npid\nboot id\nstart time".
std::string thisProcess();

}  // namespace loom
