// Google Benchmark suite of the reduce kernels: GB/s of each (dtype, op) kernel next to
// memcpy on the same buffers. Bytes counted = the output buffer (n * dtypeSize), as for
// memcpy of that buffer; a kernel reads twice that. Sizes: 64 KiB (cache) and 64 MiB
// (memory). Run: build/bin/loom_kernels_bench --benchmark_min_time=0.2s
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/comm/types.h"

namespace {

using loom::DType;
using loom::ReduceOp;

struct Buffers {
  explicit Buffers(size_t bytes)
      : a(static_cast<uint8_t*>(std::aligned_alloc(64, bytes))),
        b(static_cast<uint8_t*>(std::aligned_alloc(64, bytes))),
        out(static_cast<uint8_t*>(std::aligned_alloc(64, bytes))) {
    // Small positive values, valid in every dtype (no denormals, no NaN).
    for (size_t i = 0; i < bytes; ++i) {
      a[i] = static_cast<uint8_t>(0x30 + (i % 7));
      b[i] = static_cast<uint8_t>(0x31 + (i % 5));
      out[i] = 0;
    }
  }
  ~Buffers() {
    std::free(a);
    std::free(b);
    std::free(out);
  }
  uint8_t* a;
  uint8_t* b;
  uint8_t* out;
};

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffers buf(bytes);
  for (auto _ : state) {
    std::memcpy(buf.out, buf.a, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_Reduce(benchmark::State& state, DType dtype, ReduceOp op) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / loom::dtypeSize(dtype);
  Buffers buf(bytes);
  const loom::comm::ReduceFn fn = loom::comm::reduceFunction(dtype, op);
  for (auto _ : state) {
    fn(buf.out, buf.a, buf.b, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetLabel(loom::comm::reduceKernelIsa());
}

void BM_ReduceInPlace(benchmark::State& state, DType dtype, ReduceOp op) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / loom::dtypeSize(dtype);
  Buffers buf(bytes);
  const loom::comm::ReduceFn fn = loom::comm::reduceFunction(dtype, op);
  for (auto _ : state) {
    fn(buf.out, buf.out, buf.b, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

constexpr int64_t kSmall = 64 << 10;
constexpr int64_t kLarge = 64 << 20;

void registerAll() {
  benchmark::RegisterBenchmark("memcpy", BM_Memcpy)->Arg(kSmall)->Arg(kLarge);
  struct Entry {
    DType dtype;
    ReduceOp op;
  };
  const Entry entries[] = {
      {DType::kFloat32, ReduceOp::kSum},  {DType::kFloat32, ReduceOp::kProd},
      {DType::kFloat32, ReduceOp::kMin},  {DType::kFloat32, ReduceOp::kMax},
      {DType::kFloat64, ReduceOp::kSum},  {DType::kFloat64, ReduceOp::kMax},
      {DType::kFloat16, ReduceOp::kSum},  {DType::kFloat16, ReduceOp::kMax},
      {DType::kBFloat16, ReduceOp::kSum}, {DType::kBFloat16, ReduceOp::kMax},
      {DType::kInt8, ReduceOp::kSum},     {DType::kInt8, ReduceOp::kMin},
      {DType::kUInt8, ReduceOp::kMax},    {DType::kInt32, ReduceOp::kSum},
      {DType::kInt32, ReduceOp::kProd},   {DType::kInt32, ReduceOp::kBxor},
      {DType::kInt64, ReduceOp::kSum},    {DType::kInt64, ReduceOp::kProd},
      {DType::kInt64, ReduceOp::kMin},    {DType::kInt64, ReduceOp::kBand},
  };
  for (const Entry& e : entries) {
    const std::string name =
        std::string("reduce/") + loom::dtypeName(e.dtype) + "/" + loom::reduceOpName(e.op);
    benchmark::RegisterBenchmark(name.c_str(), BM_Reduce, e.dtype, e.op)->Arg(kSmall)->Arg(kLarge);
  }
  benchmark::RegisterBenchmark("reduce_inplace/float/sum", BM_ReduceInPlace, DType::kFloat32,
                               ReduceOp::kSum)
      ->Arg(kSmall)
      ->Arg(kLarge);
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
