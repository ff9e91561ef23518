// main() of the mpi tests: MPI is initialized (by Loom) before any test runs, the world group
// is destroyed before MPI is finalized at exit, and only rank 0 prints gtest's full report; the
// other ranks print their failures only, prefixed with the rank. mpirun's exit status is
// non-zero when any rank's is.
#include <gtest/gtest.h>

#include <iostream>

#include "mpi_test_support.h"

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
  const loom::MpiWorld w = loom::mpiWorld();
  if (w.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(w.rank));
  } else {
    std::cout << "mpi tests: " << w.size << " ranks, " << w.library << ", " << w.threadLevel
              << std::endl;
  }
  const int rc = RUN_ALL_TESTS();
  loom::mpi_testing::worldSlot().reset();
  return rc;
}
