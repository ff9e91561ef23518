// The nccl backend on a real GPU with 2, 3 and 4 ranks as processes sharing it (each rank sets
// NCCL_HOSTID to its own value, so NCCL treats them as separate hosts and connects them over
// its socket transport): every dtype and reduce op against the closed form, with c10d's
// semantics (bool sum/max = or, prod/min = and), the collectives that move data, a ring
// exchange by send/recv and by batchSendRecv (one NCCL group each), and an operation ordered
// on a caller's stream. Then the failure diagnosis on the device, as nccl_fake_test and
// nccl_fake_process_test check it on fake devices: a rank that never enters a collective is
// named by the surviving rank's error, and a SIGKILLed rank is named dead, each within the
// operation's timeout + 5 s. Skips (a child looks; the parent never touches CUDA before
// forking) without a device. Tens of seconds on a GPU (NCCL setup per world size dominates).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/nccl.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "nccl/nccl_backend.h"

namespace loom {
namespace {

using std::chrono::milliseconds;

void cudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) LOOM_THROW(IoError, what, " failed: ", cudaGetErrorString(e));
}

// Element i of rank r's input: 1, 2 or 3 (bool: true for two ranks in three).
double inputValue(DType dtype, int r, size_t i) {
  if (dtype == DType::kBool) return (static_cast<size_t>(r) * 7 + i) % 3 != 0 ? 1 : 0;
  return static_cast<double>((static_cast<size_t>(r) + i) % 3 + 1);
}

double closedForm(DType dtype, ReduceOp op, int n, size_t i) {
  double acc = inputValue(dtype, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = inputValue(dtype, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      default:
        acc = std::max(acc, v);
        break;
    }
  }
  if (dtype == DType::kBool) return acc != 0 ? 1 : 0;  // c10d: or / and
  if (op == ReduceOp::kAvg) {
    acc /= n;
    if (!isFloatingPoint(dtype)) acc = std::trunc(acc);
  }
  return acc;
}

void put(DType dtype, std::vector<char>& bytes, size_t i, double v) {
  char* p = bytes.data() + i * dtypeSize(dtype);
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(p, &v, 8);
      break;
    case DType::kFloat16: {
      const uint16_t h = comm::floatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = comm::floatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kInt8:
      *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v);
      break;
    case DType::kUInt8:
    case DType::kBool:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
    case DType::kInt32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::kInt64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
  }
}

double get(DType dtype, const std::vector<char>& bytes, size_t i) {
  const char* p = bytes.data() + i * dtypeSize(dtype);
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return comm::halfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return comm::bfloat16ToFloat(h);
    }
    case DType::kInt8:
      return *reinterpret_cast<const int8_t*>(p);
    case DType::kUInt8:
    case DType::kBool:
      return *reinterpret_cast<const uint8_t*>(p);
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
  }
  return 0;
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 2e-2;
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat64:
      return 1e-12;  // AVG over 3 ranks: NCCL scales each value by 1/3, then sums: 2 - 2^-52
    default:
      return 0;
  }
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cudaOk(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

BufferView viewOf(void* p, size_t count, DType dtype) {
  BufferView v;
  v.data = p;
  v.count = count;
  v.dtype = dtype;
  v.device = Device::cuda(0);
  return v;
}

// One rank of the sweep (in a child process). Throws with the first mismatch.
void rankMain(int rank, int n, const std::string& storePath) {
  const std::string hostId = "loomhost" + std::to_string(rank);
  setenv("NCCL_HOSTID", hostId.c_str(), 1);
  auto store = std::make_shared<FileStore>(storePath);
  ProcessGroupOptions options;
  options.timeout = milliseconds(120000);
  options.nccl.device = 0;
  auto pg = createProcessGroup("nccl", store, rank, n, options);

  constexpr size_t count = 1000;
  DeviceBuffer in(count * 8), out(count * 8);
  const DType dtypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                          DType::kBFloat16, DType::kInt8,    DType::kUInt8,
                          DType::kInt32,    DType::kInt64,   DType::kBool};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kAvg};
  for (DType dtype : dtypes) {
    for (ReduceOp op : ops) {
      if (dtype == DType::kBool && op == ReduceOp::kAvg) continue;  // refused (nccl_fake_test)
      const size_t bytes = count * dtypeSize(dtype);
      std::vector<char> host(bytes);
      for (size_t i = 0; i < count; ++i) put(dtype, host, i, inputValue(dtype, rank, i));
      cudaOk(cudaMemcpy(in.ptr, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      AllreduceOptions ao;
      ao.reduceOp = op;
      // Out of place; wait() orders the legacy default stream (cudaMemcpy's) after it.
      pg->allreduce(viewOf(in.ptr, count, dtype), viewOf(out.ptr, count, dtype), ao)->wait();
      cudaOk(cudaMemcpy(host.data(), out.ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (size_t i = 0; i < count; ++i) {
        const double want = closedForm(dtype, op, n, i);
        const double got = get(dtype, host, i);
        if (std::fabs(got - want) > tolerance(dtype) * std::fabs(want)) {
          LOOM_THROW(InvalidArgumentError, "rank ", rank, " of ", n, ": allreduce ",
                     dtypeName(dtype), " ", reduceOpName(op), " element ", i, ": got ", got,
                     ", expected ", want);
        }
      }
    }
  }

  // The example: bool [1,1,0,0] and [1,0,0,1] sum to [1,1,0,1] (or), not [2,1,0,1].
  {
    const uint8_t mine[2][4] = {{1, 1, 0, 0}, {1, 0, 0, 1}};
    std::vector<uint8_t> host(mine[rank % 2], mine[rank % 2] + 4);
    cudaOk(cudaMemcpy(in.ptr, host.data(), 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    pg->allreduce(viewOf(in.ptr, 4, DType::kBool))->wait();
    cudaOk(cudaMemcpy(host.data(), in.ptr, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    const std::vector<uint8_t> want = {1, 1, 0, 1};
    LOOM_CHECK(host == want, "rank ", rank, ": bool sum is not a logical or: got ", int(host[0]),
               int(host[1]), int(host[2]), int(host[3]));
  }

  // A ring exchange (send right, then receive from the left), then the same by batchSendRecv:
  // each one NCCL group, so it cannot deadlock whatever the size.
  {
    const size_t floats = (n == 2 ? 64u : 1u) << 20 >> 2;  // 64 MiB at 2 ranks, 1 MiB above
    DeviceBuffer sendBuf(floats * 4), recvBuf(floats * 4);
    std::vector<float> host(floats, static_cast<float>(rank + 1));
    cudaOk(cudaMemcpy(sendBuf.ptr, host.data(), floats * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    for (int round = 0; round < 2; ++round) {
      cudaOk(cudaMemset(recvBuf.ptr, 0, floats * 4), "cudaMemset");
      std::vector<std::shared_ptr<Work>> works;
      if (round == 0) {
        works.push_back(pg->send(viewOf(sendBuf.ptr, floats, DType::kFloat32), right));
        works.push_back(pg->recv(viewOf(recvBuf.ptr, floats, DType::kFloat32), left));
      } else {
        works = pg->batchSendRecv(
            {{OpType::kSend, viewOf(sendBuf.ptr, floats, DType::kFloat32), right, 0},
             {OpType::kRecv, viewOf(recvBuf.ptr, floats, DType::kFloat32), left, 0}});
      }
      for (auto& w : works) w->wait(milliseconds(120000));
      cudaOk(cudaMemcpy(host.data(), recvBuf.ptr, floats * 4, cudaMemcpyDeviceToHost),
             "cudaMemcpy");
      for (size_t i = 0; i < floats; i += 4097) {
        LOOM_CHECK_EQ(host[i], static_cast<float>(left + 1), "rank ", rank, ": ring round ", round,
                      " element ", i);
      }
    }
  }

  // Ordered on a caller's own stream: the input written there, the result read there.
  {
    cudaStream_t s = nullptr;
    cudaOk(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<float> host(count, 2.0f);
    cudaOk(cudaMemcpyAsync(in.ptr, host.data(), count * 4, cudaMemcpyHostToDevice, s),
           "cudaMemcpyAsync");
    {
      NcclStreamGuard guard(s);
      pg->allreduce(viewOf(in.ptr, count, DType::kFloat32))->wait();
    }
    cudaOk(cudaMemcpyAsync(host.data(), in.ptr, count * 4, cudaMemcpyDeviceToHost, s),
           "cudaMemcpyAsync");
    cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    for (size_t i = 0; i < count; ++i) {
      LOOM_CHECK_EQ(host[i], 2.0f * n, "rank ", rank, ": allreduce on the caller's stream");
    }
    cudaStreamDestroy(s);
  }

  // broadcast, allgather, reduce_scatter (float, closed forms).
  {
    std::vector<float> host(count * n);
    for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(rank * 1000 + i);
    DeviceBuffer big(count * n * 4);
    cudaOk(cudaMemcpy(in.ptr, host.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    pg->allgather(viewOf(in.ptr, count, DType::kFloat32),
                  viewOf(big.ptr, count * n, DType::kFloat32))
        ->wait();
    cudaOk(cudaMemcpy(host.data(), big.ptr, count * n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; i += 97) {
        LOOM_CHECK_EQ(host[r * count + i], static_cast<float>(r * 1000 + i), "allgather");
      }
    }
    BroadcastOptions bo;
    bo.root = n - 1;
    pg->broadcast(viewOf(in.ptr, count, DType::kFloat32), bo)->wait();
    cudaOk(cudaMemcpy(host.data(), in.ptr, count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < count; i += 97) {
      LOOM_CHECK_EQ(host[i], static_cast<float>((n - 1) * 1000 + i), "broadcast");
    }
    for (size_t i = 0; i < count * n; ++i) host[i] = 1.0f;
    cudaOk(cudaMemcpy(big.ptr, host.data(), count * n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    pg->reduceScatter(viewOf(big.ptr, count * n, DType::kFloat32),
                      viewOf(out.ptr, count, DType::kFloat32))
        ->wait();
    cudaOk(cudaMemcpy(host.data(), out.ptr, count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < count; i += 97) {
      LOOM_CHECK_EQ(host[i], static_cast<float>(n), "reduce_scatter");
    }
  }
  pg->barrier()->wait(milliseconds(120000));
}

bool deviceVisible() {
  testing::ChildProcesses probe;
  probe.spawn([] { _exit(ncclDeviceCount() > 0 ? 0 : 77); }, "probe");
  const auto exits = probe.waitAll(milliseconds(60000));
  return exits[0].exited && exits[0].code == 0;
}

class NcclRanks : public ::testing::TestWithParam<int> {};

TEST_P(NcclRanks, EveryDtypeAndOpRingExchangeAndCollectives) {
  if (!deviceVisible()) GTEST_SKIP() << "no CUDA device";
  const int n = GetParam();
  testing::TempDir dir;
  testing::ChildProcesses ranks;
  const std::string storePath = dir.file("store");
  ranks.spawnRanks(n, [&](int rank) { rankMain(rank, n, storePath); });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(240000)), "");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclRanks, ::testing::Values(2, 3, 4));

// Two ranks on the GPU. Rank 1 either stays alive without entering the all-reduce
// (kNeverArrives) or is SIGKILLed (kKilled); rank 0's all-reduce (timeout 2 s, report window
// 1 s) must fail within timeout + 5 s with an error that names the operation and rank 1's
// state.
enum class Culprit { kNeverArrives, kKilled };

void failureRank(int rank, const std::string& storePath, Culprit culprit) {
  const std::string hostId = "loomhost" + std::to_string(rank);
  setenv("NCCL_HOSTID", hostId.c_str(), 1);
  auto store = std::make_shared<FileStore>(storePath);
  ProcessGroupOptions options;
  options.timeout = milliseconds(60000);
  options.heartbeatInterval = milliseconds(100);
  options.failureReportWindow = milliseconds(1000);
  options.nccl.device = 0;
  auto pg = createProcessGroup("nccl", store, rank, 2, options);
  DeviceBuffer buf(1024);
  pg->allreduce(viewOf(buf.ptr, 256, DType::kFloat32))->wait(milliseconds(60000));  // both up
  if (rank == 1) {
    store->set("test/ready", std::string_view("1"));
    if (culprit == Culprit::kKilled) kill(getpid(), SIGKILL);
    store->wait({"test/done"}, milliseconds(60000));  // alive, never entering allreduce#2
    _exit(0);  // skips the group's orderly destruction: rank 0's is gone
  }
  store->wait({"test/ready"}, milliseconds(60000));
  AllreduceOptions quick;
  quick.timeout = milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    pg->allreduce(viewOf(buf.ptr, 256, DType::kFloat32), quick)->wait(milliseconds(60000));
  } catch (const std::exception& e) {
    what = e.what();
  }
  const auto took =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
  store->set("test/done", std::string_view("1"));
  std::fprintf(stderr, "rank 0's error after %lld ms:\n%s\n", static_cast<long long>(took.count()),
               what.c_str());
  LOOM_CHECK(!what.empty(), "the all-reduce did not fail");
  LOOM_CHECK(took < milliseconds(2000 + 5000), "the error came after ", took.count(), " ms");
  LOOM_CHECK(what.find("allreduce#2") != std::string::npos, "no operation named: ", what);
  if (culprit == Culprit::kKilled) {
    LOOM_CHECK(what.find("rank 1") != std::string::npos && what.find("dead") != std::string::npos,
               "rank 1 is not named dead: ", what);
  } else {
    LOOM_CHECK(what.find("rank 1 never entered collective #2") != std::string::npos,
               "rank 1 is not named as the rank that never arrived: ", what);
  }
  _exit(0);  // the communicator was aborted; nothing to tear down in order
}

TEST(NcclFailureOnDevice, TheErrorNamesTheRankThatNeverArrived) {
  if (!deviceVisible()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  testing::ChildProcesses ranks;
  const std::string storePath = dir.file("store");
  ranks.spawnRanks(2, [&](int rank) { failureRank(rank, storePath, Culprit::kNeverArrives); });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(120000)), "");
}

TEST(NcclFailureOnDevice, ASigkilledRankIsNamedDeadWithinTheTimeoutPlusFiveSeconds) {
  if (!deviceVisible()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  testing::ChildProcesses ranks;
  const std::string storePath = dir.file("store");
  ranks.spawnRanks(2, [&](int rank) { failureRank(rank, storePath, Culprit::kKilled); });
  const auto exits = ranks.waitAll(milliseconds(120000));
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_TRUE(exits[0].ok()) << exits[0].describe();
  EXPECT_EQ(exits[1].signal, SIGKILL) << exits[1].describe();
}

}  // namespace
}  // namespace loom
