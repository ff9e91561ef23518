// The NCCL backend on a real device: a one-rank group (NCCL allows one rank per GPU, and the
// CI machines have none, so this skips there).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/store/hash_store.h"
#include "nccl/nccl_backend.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

TEST(NcclDevice, OneRankCollectivesAndChecks) {
  if (ncclDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  options.nccl.device = 0;
  auto pg = createProcessGroup("nccl", store, 0, 1, options);
  ASSERT_TRUE(isAvailable("nccl"));

  constexpr size_t n = 1000;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  float* d = nullptr;
  float* g = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&g, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);

  const Device dev = Device::cuda(0);
  EXPECT_TRUE(pg->allreduce(view(d, n, dev))->wait());
  EXPECT_TRUE(pg->broadcast(view(d, n, dev))->wait());
  EXPECT_TRUE(pg->allgather(view(d, n, dev), view(g, n, dev))->wait());
  EXPECT_TRUE(pg->alltoall(view(g, n, dev), view(d, n, dev))->wait());
  auto barrier = pg->barrier();
  EXPECT_TRUE(barrier->wait(std::chrono::milliseconds(60000)));
  EXPECT_EQ(barrier->seq(), 5u);

  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);

  // Out of place (one rank: every result is the input): the output gets it, the input stays.
  const auto outOfPlace = [&](const char* name, auto&& issue) {
    ASSERT_EQ(cudaMemset(g, 0, n * sizeof(float)), cudaSuccess);
    EXPECT_TRUE(issue()->wait()) << name;
    ASSERT_EQ(cudaMemcpy(back.data(), g, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host) << name << ": output";
    ASSERT_EQ(cudaMemcpy(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host) << name << ": input";
  };
  outOfPlace("allreduce", [&] { return pg->allreduce(view(d, n, dev), view(g, n, dev)); });
  outOfPlace("broadcast", [&] { return pg->broadcast(view(d, n, dev), view(g, n, dev)); });
  outOfPlace("reduce", [&] { return pg->reduce(view(d, n, dev), view(g, n, dev)); });

  std::vector<float> cpu(n);
  try {
    pg->allreduce(view(cpu.data(), n));
    FAIL() << "a CPU buffer must be refused";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("takes cuda:0 buffers, got a cpu buffer"));
  }
  AllreduceOptions bxor;
  bxor.reduceOp = ReduceOp::kBxor;
  std::vector<int32_t> ints(4);
  int32_t* di = nullptr;
  ASSERT_EQ(cudaMalloc(&di, 4 * sizeof(int32_t)), cudaSuccess);
  EXPECT_THROW(pg->allreduce(view(di, 4, dev), bxor), InvalidArgumentError);
  pg.reset();
  cudaFree(d);
  cudaFree(g);
  cudaFree(di);
}

}  // namespace
}  // namespace loom
