// Built when Loom was configured without MPI (LOOM_WITH_MPI=OFF, or AUTO and not found).
#include "loom/common/error.h"
#include "loom/process_group/mpi.h"

namespace loom {

MpiWorld mpiWorld() {
  LOOM_THROW(NotAvailableError,
             "built without MPI (LOOM_WITH_MPI=OFF, or Open MPI was not found at configure time; "
             "scripts/setup.sh installs openmpi-bin and libopenmpi-dev)");
}

}  // namespace loom
