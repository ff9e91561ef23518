// loom-nccl-allreduce: NCCL called directly (no Loom group), for the baseline the nccl backend is
// compared against (issue 39: from 1 MiB, within 5% of NCCL itself). nccl-tests' all_reduce_perf
// in small: the same sweep flags and columns
//   size count type redop root | time algbw busbw #wrong (out of place) | the same (in place)
// with time the mean microseconds per call over -n calls issued back to back on one stream and
// then synchronized (as nccl-tests times; with -s 1 the stream is synchronized after every call,
// the per-operation cost that loom-bench and torch's all_reduce + synchronize measure),
// algbw = size / time, busbw = algbw x 2(n-1)/n.
//
// Ranks: one process each, from the launcher's environment (loom-run, torchrun: RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; one process alone needs none of them).
// Rank 0 creates the ncclUniqueId and hands it out through a TCPStore hosted at MASTER_ADDR /
// MASTER_PORT. Device: LOCAL_RANK modulo the visible devices (NCCL_HOSTID per rank lets several
// ranks share one GPU: NCCL then treats them as separate hosts).
//
// #wrong: before the timed calls, each rank fills its input with (rank + i) % 3 + 1 (element i),
// runs one call and compares the output with the closed form computed on the host (exact: small
// integers; floating types within a relative 1e-6), and rank 0 prints its count of elements
// that differ. float, double, int8, uint8, int32 and
// int64; ops sum, prod, min, max, avg (avg on floating types only).
//
// Exit status: 0, or 3 when some element was wrong (every rank checks its own output). Without a
// CUDA device it prints "# skipped: ..." and exits 0 (so that ctest and scripts can run it
// everywhere); any other failure exits 1 with the reason, a bad flag 2.
#include <cuda_runtime.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/bench/sizes.h"
#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/process_group/init.h"
#include "loom/store/tcp_store.h"

namespace {

using Clock = std::chrono::steady_clock;

void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) LOOM_THROW(loom::IoError, what, " failed: ", cudaGetErrorString(e));
}
void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) LOOM_THROW(loom::IoError, what, " failed: ", ncclGetErrorString(r));
}

struct TypeInfo {
  const char* name;
  ncclDataType_t type;
  size_t size;
  bool floating;
};
const TypeInfo kTypes[] = {
    {"float", ncclFloat32, 4, true}, {"double", ncclFloat64, 8, true},
    {"int8", ncclInt8, 1, false},    {"uint8", ncclUint8, 1, false},
    {"int32", ncclInt32, 4, false},  {"int64", ncclInt64, 8, false},
};
struct OpInfo {
  const char* name;
  ncclRedOp_t op;
};
const OpInfo kOps[] = {
    {"sum", ncclSum}, {"prod", ncclProd}, {"min", ncclMin}, {"max", ncclMax}, {"avg", ncclAvg}};

double inputValue(int rank, size_t i) {
  return static_cast<double>((static_cast<size_t>(rank) + i) % 3 + 1);
}

// The closed form of element i over `size` ranks, in double (exact for these small integers
// except prod, which is wrapped to the type's width by the caller's store).
double expectedValue(const OpInfo& op, int size, size_t i) {
  double acc = inputValue(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = inputValue(r, i);
    if (std::strcmp(op.name, "prod") == 0) {
      acc *= v;
    } else if (std::strcmp(op.name, "min") == 0) {
      acc = std::min(acc, v);
    } else if (std::strcmp(op.name, "max") == 0) {
      acc = std::max(acc, v);
    } else {
      acc += v;
    }
  }
  if (std::strcmp(op.name, "avg") == 0) acc /= size;
  return acc;
}

template <class T>
void storeAs(std::vector<char>& bytes, size_t i, double v) {
  T t;
  if constexpr (std::is_integral_v<T>) {
    // Wrap (prod overflows the narrow types as the device's integer arithmetic does).
    t = static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(v)));
  } else {
    t = static_cast<T>(v);
  }
  std::memcpy(bytes.data() + i * sizeof(T), &t, sizeof(T));
}

void storeValue(const TypeInfo& type, std::vector<char>& bytes, size_t i, double v) {
  switch (type.type) {
    case ncclFloat32:
      return storeAs<float>(bytes, i, v);
    case ncclFloat64:
      return storeAs<double>(bytes, i, v);
    case ncclInt8:
      return storeAs<int8_t>(bytes, i, v);
    case ncclUint8:
      return storeAs<uint8_t>(bytes, i, v);
    case ncclInt32:
      return storeAs<int32_t>(bytes, i, v);
    default:
      return storeAs<int64_t>(bytes, i, v);
  }
}

// Element i of `got` and `want`: bit-equal for integers; for floating types within a relative
// 1e-6 (avg: NCCL multiplies each input by 1/n before summing, the host divides the sum).
bool same(const TypeInfo& type, const std::vector<char>& got, const std::vector<char>& want,
          size_t i) {
  const char* g = got.data() + i * type.size;
  const char* w = want.data() + i * type.size;
  if (!type.floating) return std::memcmp(g, w, type.size) == 0;
  double a = 0, b = 0;
  if (type.size == 4) {
    float fa, fb;
    std::memcpy(&fa, g, 4);
    std::memcpy(&fb, w, 4);
    a = fa;
    b = fb;
  } else {
    std::memcpy(&a, g, 8);
    std::memcpy(&b, w, 8);
  }
  return std::fabs(a - b) <= 1e-6 * std::fabs(b);
}

// What -s does after every call, as the header line says it.
constexpr const char* kSyncNames[] = {
    "back to back", "synchronized after each call",
    "blocking-sync event after each call, queried 50 us then synchronized",
    "caller-stream order, then a blocking-sync event queried 50 us then synchronized",
    "caller-stream order, then a plain event queried until done"};

int run(int argc, char** argv) {
  CLI::App app{"loom-nccl-allreduce: ncclAllReduce called directly, nccl-tests' columns"};
  std::string minText = "8", maxText = "128M", typeName = "float", opName = "sum";
  int factor = 2, iters = 20, warmup = 5, check = 1, syncEach = 0;
  app.add_option("-b,--minbytes", minText, "smallest size (8, 64K, 16M)");
  app.add_option("-e,--maxbytes", maxText, "largest size");
  app.add_option("-f,--stepfactor", factor, "size factor between rows");
  app.add_option("-n,--iters", iters, "timed calls per size")->check(loom::cli::wholeAtLeast(1));
  app.add_option("-w,--warmup_iters", warmup, "untimed calls per size")
      ->check(loom::cli::wholeAtLeast(0));
  app.add_option("-c,--check", check, "1: count wrong elements (#wrong)");
  app.add_option("-s,--sync_each", syncEach,
                 "1: synchronize the stream after every call (the per-operation cost, as "
                 "loom-bench's and torch's timed waits); 0: back to back (nccl-tests); the steps "
                 "of the nccl backend's blocking wait, to see what each costs: 2: an event "
                 "(blocking sync) recorded after the call, queried for 50 us, then "
                 "cudaEventSynchronize; 3: 2 and before the call an event recorded on the legacy "
                 "default stream that the stream waits for (the caller-stream order); 4: 3 with "
                 "a plain event queried until done")
      ->check(loom::cli::wholeIn(0, 4));
  app.add_option("-d,--datatype", typeName, "float, double, int8, uint8, int32, int64");
  app.add_option("-o,--op", opName, "sum, prod, min, max, avg");
  CLI11_PARSE(app, argc, argv);

  const TypeInfo* type = nullptr;
  for (const auto& t : kTypes) {
    if (typeName == t.name) type = &t;
  }
  const OpInfo* op = nullptr;
  for (const auto& o : kOps) {
    if (opName == o.name) op = &o;
  }
  if (type == nullptr || op == nullptr) {
    std::fprintf(stderr, "loom-nccl-allreduce: unknown %s '%s'\n", type == nullptr ? "type" : "op",
                 type == nullptr ? typeName.c_str() : opName.c_str());
    return 2;
  }
  if (op->op == ncclAvg && !type->floating) {
    std::fprintf(stderr, "loom-nccl-allreduce: avg is checked on floating types only\n");
    return 2;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("# skipped: no CUDA device is visible to this process\n");
    return 0;
  }
  const loom::Environment env = loom::launchEnvironment();
  const bool single = env.find("WORLD_SIZE") == env.end();
  loom::LaunchEnv launch;
  if (!single) launch = loom::parseLaunchEnv(env);
  const int rank = launch.rank, size = launch.worldSize;
  const int device = launch.localRank % devices;
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::unique_ptr<loom::TCPStore> store;
  if (rank == 0) ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (size > 1) {
    loom::TCPStoreOptions so;
    so.isServer = rank == 0;
    so.numWorkers = size;
    so.rank = rank;
    so.timeout = std::chrono::seconds(120);
    store = std::make_unique<loom::TCPStore>(launch.masterAddr, launch.masterPort, so);
    const std::string key = "nccl_direct/unique_id";
    if (rank == 0) {
      store->set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string got = store->getString(key);
      LOOM_CHECK_EQ(got.size(), sizeof(id), "unique id bytes");
      std::memcpy(&id, got.data(), sizeof(id));
    }
  }
  ncclComm_t comm = nullptr;
  ncclCheck(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const size_t minBytes = loom::bench::parseSize(minText);
  const size_t maxBytes = loom::bench::parseSize(maxText);
  const auto sizes = loom::bench::sweepSizes(minBytes, maxBytes, static_cast<size_t>(factor));
  void* in = nullptr;
  void* out = nullptr;
  cudaCheck(cudaMalloc(&in, maxBytes), "cudaMalloc");
  cudaCheck(cudaMalloc(&out, maxBytes), "cudaMalloc");
  if (rank == 0) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    int version = 0;
    ncclGetVersion(&version);
    std::printf("# loom-nccl-allreduce: nranks %d, NCCL %d, device %d %s, %s\n", size, version,
                device, prop.name, kSyncNames[syncEach]);
    std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)",
                "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  cudaEvent_t ready = nullptr, blocking = nullptr, plain = nullptr;
  cudaCheck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cudaCheck(cudaEventCreateWithFlags(&blocking, cudaEventDisableTiming | cudaEventBlockingSync),
            "cudaEventCreate");
  cudaCheck(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming), "cudaEventCreate");
  std::vector<char> host(maxBytes), expect(maxBytes);
  long wrongTotal = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / type->size;
    if (count == 0) continue;
    const size_t used = count * type->size;
    double timeUs[2] = {0, 0};
    long wrong[2] = {0, 0};
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      void* dst = inPlace ? in : out;
      if (check) {
        for (size_t i = 0; i < count; ++i) storeValue(*type, host, i, inputValue(rank, i));
        cudaCheck(cudaMemcpy(in, host.data(), used, cudaMemcpyHostToDevice), "cudaMemcpy");
        ncclCheck(ncclAllReduce(in, dst, count, type->type, op->op, comm, stream), "ncclAllReduce");
        cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        cudaCheck(cudaMemcpy(host.data(), dst, used, cudaMemcpyDeviceToHost), "cudaMemcpy");
        for (size_t i = 0; i < count; ++i)
          storeValue(*type, expect, i, expectedValue(*op, size, i));
        for (size_t i = 0; i < count; ++i) wrong[inPlace] += !same(*type, host, expect, i);
      }
      for (int i = 0; i < warmup; ++i) {
        ncclCheck(ncclAllReduce(in, dst, count, type->type, op->op, comm, stream), "ncclAllReduce");
      }
      cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (syncEach >= 3) {
          cudaCheck(cudaEventRecord(ready, cudaStreamLegacy), "cudaEventRecord");
          cudaCheck(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
        }
        ncclCheck(ncclAllReduce(in, dst, count, type->type, op->op, comm, stream), "ncclAllReduce");
        if (syncEach == 1) cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        if (syncEach >= 2) {
          cudaEvent_t ev = syncEach == 4 ? plain : blocking;
          cudaCheck(cudaEventRecord(ev, stream), "cudaEventRecord");
          const auto spinUntil = Clock::now() + std::chrono::microseconds(50);
          cudaError_t q = cudaEventQuery(ev);
          while (q == cudaErrorNotReady && (syncEach == 4 || Clock::now() < spinUntil)) {
            q = cudaEventQuery(ev);
          }
          if (q == cudaErrorNotReady) cudaCheck(cudaEventSynchronize(ev), "cudaEventSynchronize");
        }
      }
      cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      timeUs[inPlace] =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
    }
    if (rank == 0) {
      const double factorBus = size > 1 ? 2.0 * (size - 1) / size : 1.0;
      std::printf("  %10zu %12zu %8s %6s %6d", used, count, type->name, op->name, -1);
      for (int k = 0; k < 2; ++k) {
        const double algbw = static_cast<double>(used) / (timeUs[k] * 1e3);
        std::printf(" %9.2f %7.2f %7.2f %6ld", timeUs[k], algbw, algbw * factorBus,
                    check ? wrong[k] : -1L);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    wrongTotal += wrong[0] + wrong[1];
  }
  std::printf("# rank %d: out of bounds values: %ld %s\n", rank, wrongTotal,
              wrongTotal == 0 ? "OK" : "FAILED");
  cudaEventDestroy(ready);
  cudaEventDestroy(blocking);
  cudaEventDestroy(plain);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
  return wrongTotal == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-nccl-allreduce: %s\n", e.what());
    return 1;
  }
}
