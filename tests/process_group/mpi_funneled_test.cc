// Built with LOOM_MPI_TEST_OWN_INIT=MPI_THREAD_FUNNELED (CMakeLists.txt): the program
// initialized MPI below the level the backend needs, so it refuses with NotAvailableError
// saying why, on every entry point, and leaves MPI to the program.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "loom/common/error.h"
#include "mpi_test_support.h"

namespace loom::mpi_testing {
namespace {

using ::testing::HasSubstr;

TEST(MpiInit, BelowSerializedIsNotAvailable) {
  int provided = 0;
  MPI_Query_thread(&provided);
  ASSERT_LT(provided, MPI_THREAD_SERIALIZED) << "the program asked for MPI_THREAD_FUNNELED";
  try {
    mpiWorld();
    FAIL() << "mpiWorld() accepted MPI_THREAD_FUNNELED";
  } catch (const NotAvailableError& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_THROW(createProcessGroup("mpi", nullptr, rank, size), NotAvailableError);
  // MPI stays the program's and usable.
  int one = 1, sum = 0;
  EXPECT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_EQ(sum, size);
}

}  // namespace
}  // namespace loom::mpi_testing
