// main() of the mpi tests. MPI is initialized before any test runs: by Loom (mpiWorld()), or,
// when built with LOOM_MPI_TEST_OWN_INIT=<thread level>, by this program with that level (then
// the program finalizes MPI itself, as mpi.h asks). The world group is destroyed before MPI is
// finalized. Only rank 0 prints gtest's full report; the other ranks print their failures
// only, prefixed with the rank. mpirun's exit status is non-zero when any rank's is.
#include <gtest/gtest.h>

#include <iostream>

#include "mpi_test_support.h"

#ifdef LOOM_MPI_TEST_OWN_INIT
#include <mpi.h>
#endif

namespace {

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": " << result.message() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
#ifdef LOOM_MPI_TEST_OWN_INIT
  int provided = 0;
  MPI_Init_thread(&argc, &argv, LOOM_MPI_TEST_OWN_INIT, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::cout << "mpi tests: MPI initialized by the program, thread level " << provided
              << std::endl;
  }
#else
  const loom::MpiWorld w = loom::mpiWorld();
  rank = w.rank;
  if (rank == 0) {
    std::cout << "mpi tests: " << w.size << " ranks, " << w.library << ", " << w.threadLevel
              << std::endl;
  }
#endif
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  loom::mpi_testing::worldSlot().reset();
#ifdef LOOM_MPI_TEST_OWN_INIT
  MPI_Finalize();
#endif
  return rc;
}
