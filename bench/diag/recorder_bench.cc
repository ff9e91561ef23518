// The flight recorder's cost per operation: what an 8-byte shm all-reduce pays for it.
#include <benchmark/benchmark.h>

#include "diagnostics/flight_recorder.h"

namespace {

using loom::OpDesc;
using loom::diag::FlightRecorder;

OpDesc allreduce() {
  OpDesc op;
  op.type = loom::OpType::kAllreduce;
  op.dtype = loom::DType::kFloat32;
  op.count = 2;
  return op;
}

// One operation: issue, start, end (as ProcessGroup::issue and the running thread make them).
void BM_RecordOperation(benchmark::State& state) {
  FlightRecorder rec(static_cast<size_t>(state.range(0)), loom::comm::Algorithm::kAuto);
  OpDesc op = allreduce();
  for (auto _ : state) {
    ++op.seq;
    const uint64_t id = rec.recordIssue(op);
    rec.recordStart(id);
    rec.recordEnd(id, false);
    benchmark::DoNotOptimize(id);
  }
}
BENCHMARK(BM_RecordOperation)->Arg(2000)->Arg(2048);

void BM_RecordIssue(benchmark::State& state) {
  FlightRecorder rec(2000, loom::comm::Algorithm::kAuto);
  OpDesc op = allreduce();
  for (auto _ : state) {
    ++op.seq;
    benchmark::DoNotOptimize(rec.recordIssue(op));
  }
}
BENCHMARK(BM_RecordIssue);

void BM_RecordStartEnd(benchmark::State& state) {
  FlightRecorder rec(2000, loom::comm::Algorithm::kAuto);
  const uint64_t id = rec.recordIssue(allreduce());
  for (auto _ : state) {
    rec.recordStart(id);
    rec.recordEnd(id, false);
  }
}
BENCHMARK(BM_RecordStartEnd);

}  // namespace

BENCHMARK_MAIN();
