// The process-wide side of the mpi backend: initializing and finalizing MPI, the lock that
// serializes MPI calls when MPI only provides MPI_THREAD_SERIALIZED, error codes turned into
// text, and Loom's dtypes and reduce ops mapped onto MPI's. Private to loom_process_group.
//
// Dtypes and ops
// - float32, float64, int8, uint8, int32, int64 map to MPI's own types and sum, prod, min, max,
//   band, bor, bxor to MPI's own ops (MPI_SUM ... MPI_BXOR), so MPI reduces them with its own
//   kernels. Floating-point min and max then follow Open MPI (a NaN does not always win, as it
//   does in Loom's kernels).
// - bool is MPI_C_BOOL with MPI's logical ops: sum, max and bor are MPI_LOR; prod, min and band
//   MPI_LAND; bxor MPI_LXOR (the same truth tables as Loom's bool kernels).
// - float16 and bfloat16 have no MPI type: each is a 2-byte contiguous type of Loom's, and its
//   ops are user-defined MPI_Ops that call Loom's own reduce kernels (comm/reduce.h: widened to
//   float, rounded once), created once per process and freed at finalize.
// - avg is not an MPI op: the backend reduces with the sum and divides once (comm::divideBy),
//   on the ranks that hold a result, as every other backend does.
#pragma once

#include <mpi.h>

#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "loom/comm/types.h"
#include "loom/process_group/mpi.h"

namespace loom::mpi_detail {

// Initializes MPI when nobody has (see mpi.h); throws NotAvailableError when MPI cannot be used
// (finalized already, or a thread level below SERIALIZED).
const MpiWorld& ensureInitialized();

// True once MPI_Finalize ran (an mpi group destroyed after that makes no MPI call).
bool finalized();

// Remembers the first failure of an mpi group in this process (an operation that timed out or
// failed in MPI, an abort, a group creation that timed out) with that group's timeout. When
// Loom initialized MPI, the MPI_Finalize it runs at exit is then bounded by that timeout:
// MPI_Finalize waits until every rank calls it (Open MPI fences there), and a rank stuck in the
// failure would keep this one from ever exiting while the launcher sees nothing wrong. Past the
// bound the process logs why and exits with status 1 without it, and mpirun ends the job.
// Without a failure, MPI_Finalize is not bounded: a rank may legitimately finish long before
// the others.
void noteGroupFailure(const std::string& cause, std::chrono::milliseconds timeout);
// The failure noteGroupFailure() remembered first ("" while none), and its timeout.
std::pair<std::string, std::chrono::milliseconds> groupFailure();

// Held around every MPI call the backend makes: empty (no lock) with MPI_THREAD_MULTIPLE, the
// process-wide MPI lock with MPI_THREAD_SERIALIZED.
class CallGuard {
 public:
  CallGuard();

 private:
  std::unique_lock<std::mutex> lock_;
};

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string errorString(int code);
// Throws IoError "<who>: <what> failed: <errorString>" unless code is MPI_SUCCESS.
void check(int code, const std::string& who, const std::string& what);

MPI_Datatype datatype(DType dtype);
// The MPI op that reduces `dtype` with `op` (avg: the sum's). The caller checked that the pair
// is valid (comm::checkReduceOp).
MPI_Op reduceOp(ReduceOp op, DType dtype);

// MPI_TAG_UB of MPI_COMM_WORLD: the largest tag send / recv can use.
int tagUpperBound();

}  // namespace loom::mpi_detail
