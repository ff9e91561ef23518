// Loom in a nutshell: start from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, as loom-run or torchrun set them), all-reduce, broadcast, barrier.
//   loom-run --nproc-per-node 4 loom-example-allreduce
#include <cstdio>
#include <exception>
#include <vector>

#include "loom/process_group/init.h"

int main() try {
  loom::InitResult init = loom::initProcessGroup();  // backend "tcp", init method env://
  loom::ProcessGroup& pg = *init.pg;

  // Every rank contributes rank + 1; the sum is size * (size + 1) / 2 everywhere.
  std::vector<float> grad(1024, static_cast<float>(pg.rank() + 1));
  auto work = pg.allreduce(loom::view(grad.data(), grad.size()));  // runs in the background
  work->wait();

  // Rank 0 decides, everyone learns.
  std::vector<int> config(2, pg.rank() == 0 ? 42 : 0);
  pg.broadcast(loom::view(config.data(), config.size()), {.root = 0})->wait();

  pg.barrier()->wait();
  std::printf("rank %d/%d: allreduce %.0f (expected %d), broadcast %d\n", pg.rank(), pg.size(),
              grad[0], pg.size() * (pg.size() + 1) / 2, config[0]);
  const bool ok = grad[0] == pg.size() * (pg.size() + 1) / 2.0f && config[0] == 42;
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // loom::Error names the rank, operation and peer
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
