// spawn gives its ranks what initProcessGroup("env://") needs, and one rendezvous serves both
// a ProcessGroup and RPC: the ranks all-reduce over the group, then call each other through an
// RpcAgent on the job's store.
#include <gtest/gtest.h>

#include "loom/process_group/init.h"
#include "loom/rpc/agent.h"
#include "loom/spawn/spawn.h"

namespace loom {
namespace {

constexpr int kWorld = 3;

TEST(SpawnIntegrationTest, RanksInitAProcessGroupAndRpcFromTheSpawnedEnvironment) {
  SpawnOptions options;
  options.timeout = std::chrono::milliseconds(120000);
  spawn(
      kWorld,
      [](int rank) {
        InitResult job = initProcessGroup();
        LOOM_CHECK_EQ(job.pg->rank(), rank);
        LOOM_CHECK_EQ(job.pg->size(), kWorld);
        int32_t value = rank + 1;
        job.pg->allreduce(view(&value, 1))->wait();
        LOOM_CHECK_EQ(value, 1 + 2 + 3, "all-reduce sum over the spawned ranks");

        rpc::Registry functions;
        functions.add("square", [](int x) { return x * x; });
        rpc::RpcOptions ro;
        ro.timeout = std::chrono::milliseconds(60000);
        rpc::RpcAgent agent("rank" + std::to_string(rank), rank, kWorld, job.store, functions, ro);
        const std::string next = "rank" + std::to_string((rank + 1) % kWorld);
        LOOM_CHECK_EQ(agent.rpcSync(next, "square", rpc::args(rank + 5)).get<int>(),
                      (rank + 5) * (rank + 5));
        agent.shutdown();
        // Rank 0 serves the store: the group's barrier keeps it until everyone is done with it.
        job.pg->barrier()->wait();
      },
      options);
}

}  // namespace
}  // namespace loom
