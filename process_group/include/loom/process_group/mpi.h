// The MPI runtime Loom's "mpi" backend runs on (Open MPI; built when LOOM_WITH_MPI found it).
//
// Contract
// - mpiWorld() initializes MPI on first use (MPI_Init_thread asking for MPI_THREAD_MULTIPLE)
//   unless the program did so itself, and returns this process's rank and size in
//   MPI_COMM_WORLD: what createProcessGroup("mpi", store, rank, size) expects as rank and size.
//   Thread-safe; later calls return the same answer.
// - When Loom initialized MPI it also finalizes it, at exit (std::atexit); destroy every mpi
//   group before main returns. When the program initialized MPI, the program finalizes it,
//   after destroying its mpi groups.
// - MPI must provide at least MPI_THREAD_SERIALIZED (the backend calls MPI from its worker
//   thread): with SERIALIZED every MPI call Loom makes holds one process-wide lock, with
//   MULTIPLE (what Debian's Open MPI 4.1 provides) none. A program that initialized MPI with
//   less gets NotAvailableError saying so.
// - Built without MPI (LOOM_WITH_MPI=OFF or not found): NotAvailableError.
#pragma once

#include <string>

namespace loom {

struct MpiWorld {
  int rank = 0;
  int size = 1;
  // "MPI_THREAD_MULTIPLE" or "MPI_THREAD_SERIALIZED": what MPI provided.
  std::string threadLevel;
  // MPI_Get_library_version's first line ("Open MPI v4.1.4, ...").
  std::string library;
  // True when Loom called MPI_Init_thread (and will call MPI_Finalize at exit).
  bool initializedByLoom = false;
};

MpiWorld mpiWorld();

}  // namespace loom
