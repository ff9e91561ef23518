// Run by pg_mpi_exit_test under mpirun with 2 ranks: rank 1 is stuck in its own code (it sleeps
// 60 s, then returns), rank 0's all-reduce times out after 1 s and its main returns 0. Loom
// initialized MPI, so MPI_Finalize runs at exit, and it waits for rank 1; after the failed
// group's timeout rank 0 must give up, say why, and exit 1, so that mpirun ends the job.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iostream>

#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/mpi.h"

int main() {
  using namespace std::chrono_literals;
  const loom::MpiWorld world = loom::mpiWorld();
  loom::ProcessGroupOptions options;
  options.timeout = 1000ms;
  auto pg = loom::createProcessGroup("mpi", nullptr, world.rank, world.size, options);
  if (world.rank != 0) {
    ::sleep(60);  // mpirun kills it long before, once rank 0 exits without MPI_Finalize
    return 0;
  }
  int32_t x = 1;
  try {
    pg->allreduce(loom::BufferView{&x, 1, loom::DType::kInt32, loom::Device::cpu()})->wait();
    std::cout << "rank 0: the all-reduce completed although rank 1 never called it" << std::endl;
  } catch (const loom::TimeoutError& e) {
    std::cout << "rank 0: TimeoutError: " << e.what() << std::endl;
  }
  pg.reset();
  std::cout << "rank 0: main returns 0" << std::endl;
  return 0;
}
