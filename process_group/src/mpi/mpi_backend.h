// The mpi backend (built only when LOOM_HAVE_MPI): ProcessGroup over MPI communicators. Private
// to loom_process_group: users get it through createProcessGroup("mpi", ...) and newGroup. This
// header is free of MPI headers.
//
// ProcessGroupMpi contract (on top of ProcessGroup's)
// - Membership comes from MPI, not from the store: the world group is MPI_COMM_WORLD (rank and
//   size passed to createProcessGroup must be MPI's, mpiWorld() tells them; a mismatch is an
//   InvalidArgumentError naming both); newGroup splits the parent's communicator. The group
//   works on its own duplicate of the communicator (MPI_Comm_idup, waited for against
//   options.timeout), with MPI_ERRORS_RETURN, so an MPI error becomes an IoError carrying
//   MPI's error string and never aborts the job.
// - The store may be null: nothing of MPI's setup needs one. It serves what goes through a
//   store on every backend: monitoredBarrier (InvalidArgumentError without a store) and the
//   flight recorder's dumps (kept in a private in-process store without one).
// - CPU buffers only. Counts are MPI's C ints: an operation whose counts or displacements pass
//   INT_MAX elements is an InvalidArgumentError. Tags go up to MPI_TAG_UB (2^31 - 1 in Open
//   MPI); a larger one is an InvalidArgumentError. Dtypes and ops: mpi_runtime.h.
// - One worker thread per group starts the operations with MPI's non-blocking calls
//   (MPI_Iallreduce, MPI_Isend, ...) in issue order and tests them until they complete or their
//   deadline passes. A collective runs alone (the next operation starts when it completed);
//   consecutive send / recv operations (receives from any source included) start together and
//   complete in any order, so a ring exchange does not deadlock. While an operation runs the
//   worker polls MPI_Test, yielding the CPU between tests, and sleeps 50 us between tests once
//   nothing has started or completed for 2 ms (Open MPI progresses non-blocking operations only
//   inside MPI calls). Before sleeping on an empty queue the worker looks at it for 50 us, and
//   Work::wait looks at its Work for 50 us before sleeping, so that issue-then-wait mostly
//   costs no thread wake-up.
// - In place: allreduce, reduce (root), allgather, gather (root), scatter (root), alltoall,
//   allgatherv and gatherv (root) pass MPI_IN_PLACE; alltoallv in place passes MPI_IN_PLACE when
//   its in and out splits are equal, else copies the input aside first; reduce-scatter(v) with
//   the output inside the input reduces into a staging buffer and copies (MPI_IN_PLACE would
//   put the result at the start of the buffer, not at this rank's block).
// - Failure: an MPI error or a passed deadline fails the operation (IoError, TimeoutError),
//   marks the group broken, and every queued and future operation fails at once naming the
//   cause. MPI cannot cancel a collective: a timed-out collective stays posted, the buffers it
//   was given may still be written when the other ranks reach it, and its memory is left to MPI
//   (the group keeps its staging buffers until then). Receives are cancelled. abort() never
//   waits.
// - LOOM_DEBUG=DETAIL: before each collective the worker compares every rank's signature (op,
//   dtype, count, reduce op, root), through the store when the group has one shared by the
//   ranks (a timeout names the ranks that never reached it), else by an MPI all-gather on the
//   group's communicator (a timeout cannot name them). Different signatures fail the
//   collective on every rank with an InvalidArgumentError listing them; it is skipped and the
//   group stays usable (pg_failure.h, as the comm backend does).
// - Failure reports (docs/diagnostics.md): with a shared store, a failed operation publishes
//   this rank's report and flight record, collects the other ranks' and the analysis within the
//   report window, and its error (and the group's cause) carries the diagnosis and the reports.
//   Without a store (mpirun without MASTER_ADDR) there is nobody to exchange with: the error is
//   this rank's own, and the flight record stays in the private store (dumpFlightRecord, files
//   under LOOM_DUMP_DIR). There is no failure cascade: MPI cannot cancel a collective, so the
//   other ranks fail on their own deadlines.
// - Destruction drains the queue (each operation bounded by its deadline), joins the worker and
//   frees the communicators.
#pragma once

#include <memory>
#include <vector>

#include "loom/process_group/process_group.h"

namespace loom {

// createProcessGroup("mpi", ...): MPI initialized on first use (mpi.h).
std::shared_ptr<ProcessGroup> createProcessGroupMpi(std::shared_ptr<Store> store, int rank,
                                                    int size, const ProcessGroupOptions& options);

// newGroup on an mpi parent, after factory.cc checked `ranks` (sorted, unique, in range) and
// numbered the subgroup `id`: collective over the parent. The ranks first agree on the list
// (an all-gather of its hash on the parent's control communicator, against options.timeout;
// differing lists are an InvalidArgumentError on every rank), then MPI_Comm_split makes the
// members' communicator. Non-members get nullptr.
std::shared_ptr<ProcessGroup> newGroupMpi(ProcessGroup& parent, const std::vector<int>& ranks,
                                          int id, const ProcessGroupOptions& options);

}  // namespace loom
