// createProcessGroup and newGroup: the one place that knows the concrete backends.
//
// Contract
// - createProcessGroup(backend, store, rank, size, options) is collective: every rank of the
//   group calls it with the same backend, a store shared by the group (the same keys must not
//   be used by another group: give each group its own PrefixStore), its rank and the size. It
//   returns once this rank is connected to the peers it needs, or throws TimeoutError naming
//   the ranks that never showed up within options.timeout.
// - Backends: "tcp" (comm/ algorithms over TCP, shared memory between same-host ranks),
//   "nccl" (CUDA buffers; only when built with NCCL and a CUDA device is present), "verbs"
//   (comm/ algorithms over RDMA verbs; CPU buffers; only when built with libibverbs and an
//   RDMA device is present, see docs/verbs.md), "mpi" (MPI collectives over Open MPI; CPU
//   buffers; only when built with MPI; run under mpirun: rank and size must be MPI's
//   (mpi.h: mpiWorld()), the store may be null, see docs/mpi.md). A backend that is compiled
//   out or has no device throws NotAvailableError saying why; an unknown name throws
//   InvalidArgumentError listing the valid ones; rank/size out of range throw
//   InvalidArgumentError. A rank that another process claimed in this group's store (two
//   processes given one RANK) throws InvalidArgumentError naming both, and so does every rank
//   still waiting for the group (loom/store/rank_claim.h; tcp, nccl and verbs; mpi's ranks are
//   MPI's). The same process creating a group again under the same keys is no duplicate.
// - Options: fields left at their defaults take the environment's values first (LOOM_DEBUG,
//   LOOM_PG_GRACE_US, LOOM_PG_NAP_US, LOCAL_RANK; docs/env.md); a bad value is an
//   InvalidArgumentError naming the variable. The group logs one line at level info saying what
//   carries its data, the variables set and the options that differ from their defaults.
// - newGroup(parent, ranks[, options]) is c10d's new_group: a subgroup of the given ranks of
//   `parent` (any order, no duplicates), with parent's backend. Collective over the parent:
//   every rank calls it, in the same order relative to other newGroup calls on that parent,
//   with the same ranks. Members get the new group (their rank = position in the sorted list,
//   a store namespaced "group/<id>/" in the parent's, the parent's options unless given: those
//   hold what the environment set when the parent was created); the other ranks get nullptr.
//   Blocks until the members are connected. A rank list that differs between ranks is an
//   InvalidArgumentError on the members, naming both lists.
// - isAvailable(backend) tells whether createProcessGroup can succeed for that backend in
//   this build (for "nccl" also: at least one CUDA device is visible; for "verbs": an RDMA device).
//   checkAvailable(backend) throws the error createProcessGroup would (NotAvailableError saying
//   why, InvalidArgumentError for an unknown name) without touching a store, so that a job can
//   fail on every rank alike before its rendezvous (initProcessGroup does).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/process_group/process_group.h"

namespace loom {

std::shared_ptr<ProcessGroup> createProcessGroup(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 const ProcessGroupOptions& options = {});

std::shared_ptr<ProcessGroup> newGroup(ProcessGroup& parent, const std::vector<int>& ranks);
std::shared_ptr<ProcessGroup> newGroup(ProcessGroup& parent, const std::vector<int>& ranks,
                                       const ProcessGroupOptions& options);

bool isAvailable(const std::string& backend);
void checkAvailable(const std::string& backend);

// Every backend name createProcessGroup knows, available or not: tcp, nccl, verbs, mpi.
std::vector<std::string> backendNames();

}  // namespace loom
