// A rank whose mpi group failed while a peer is stuck must still exit: MPI_Finalize at exit
// waits for every rank (Open MPI fences there), so rank 0 of mpi_stuck_peer would wait as long
// as rank 1 sleeps (60 s) and mpirun would see nothing wrong. With a failure noted, MPI_Finalize
// is bounded by the failed group's timeout (1 s), then the rank exits 1 and mpirun ends the job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

using ::testing::HasSubstr;

TEST(MpiExit, ARankWhoseGroupFailedDoesNotWaitInMpiFinalizeForAStuckPeer) {
  // Appended, not chained with +: GCC 12's false -Warray-bounds (its PR 105651).
  std::string command = LOOM_MPIRUN_COMMAND;
  command.append(" -np 2 ").append(LOOM_MPI_STUCK_PEER_PATH).append(" 2>&1");
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(out, HasSubstr("rank 0: TimeoutError: "));
  EXPECT_THAT(out, HasSubstr("rank 0: main returns 0"));
  EXPECT_THAT(out, HasSubstr("MPI_Finalize did not return within 1000 ms (the failed group's "
                             "timeout) after an mpi group of this process failed"));
  EXPECT_THAT(out, HasSubstr("exiting with status 1 without it"));
  // mpirun reports the rank that exited 1 and ends the job.
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  // Rank 1 sleeps 60 s: the job ended on rank 0's bound, not on rank 1's return.
  EXPECT_LT(took, std::chrono::seconds(45)) << out;
}

}  // namespace
