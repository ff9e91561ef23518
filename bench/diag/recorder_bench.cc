// The flight recorder's cost per operation: what an 8-byte shm all-reduce pays for it
// (docs/diagnostics.md, Cost). The three calls one operation makes, each alone, and the clock
// reads they are made of, so that a profile can be read against its parts.
#include <benchmark/benchmark.h>
#include <time.h>

#include <chrono>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "diagnostics/flight_recorder.h"
#include "loom/process_group/factory.h"
#include "loom/store/hash_store.h"

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
// Args: preciseEvery, and whether a tick is published (as the comm backend's napping worker
// does while waiters run operations inline, the 8-byte all-reduce's case). {16, 1} is the
// default hot path; {1, x} or {x, 0} read the clock three times per operation.
void BM_RecordOperation(benchmark::State& state) {
  FlightRecorder rec(2000, loom::comm::Algorithm::kAuto);
  rec.setPreciseEvery(static_cast<uint64_t>(state.range(0)));
  if (state.range(1) != 0) {
    rec.publishTick(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch() /
                                          std::chrono::nanoseconds(1)));
  }
  OpDesc op = allreduce();
  for (auto _ : state) {
    ++op.seq;
    const uint64_t id = rec.recordIssue(op);
    rec.recordStart(id);
    rec.recordEnd(id, false);
    benchmark::DoNotOptimize(id);
  }
  state.SetLabel(std::string(rec.usesTsc() ? "precise: tsc" : "precise: steady clock") +
                 (state.range(1) != 0 ? ", tick published" : ", no tick"));
}
BENCHMARK(BM_RecordOperation)->Args({16, 1})->Args({64, 1})->Args({1, 1})->Args({16, 0});

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

// The clocks an entry is stamped with, alone.
void BM_ClockTsc(benchmark::State& state) {
#if defined(__x86_64__)
  for (auto _ : state) benchmark::DoNotOptimize(__rdtsc());
#else
  state.SkipWithError("no time-stamp counter on this architecture");
#endif
}
BENCHMARK(BM_ClockTsc);

void BM_ClockCoarse(benchmark::State& state) {
  timespec ts;
  for (auto _ : state) {
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    benchmark::DoNotOptimize(ts);
  }
}
BENCHMARK(BM_ClockCoarse);

void BM_ClockSteady(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_ClockSteady);

// The whole path of one all-reduce through a group (issue, the hand-off to the waiting thread,
// execute, the comm call, completion) at world size 1, where the comm call returns at once:
// the recorder's cost where it is paid, next to the rest of the group's work, with the
// recorder off (0 entries) and on (2000, the default; second arg: preciseEvery, 16 the
// default, 1 every operation). The difference is what an 8-byte all-reduce over shm pays for
// the recorder (its comm part is the same either way).
void BM_GroupAllreduceWorld1(benchmark::State& state) {
  auto store = std::make_shared<loom::HashStore>();
  loom::ProcessGroupOptions options;
  options.flightRecorderEntries = static_cast<int>(state.range(0));
  options.flightRecorderPreciseEvery = static_cast<int>(state.range(1));
  auto pg = loom::createProcessGroup("tcp", store, 0, 1, options);
  float x[2] = {1, 2};
  const loom::BufferView v{x, 2, loom::DType::kFloat32, loom::Device::cpu()};
  for (auto _ : state) pg->allreduce(v)->wait();
  state.SetLabel(state.range(0) == 0   ? "recorder off"
                 : state.range(1) == 1 ? "recorder on, every operation precise"
                                       : "recorder on");
}
BENCHMARK(BM_GroupAllreduceWorld1)
    ->Args({0, 16})
    ->Args({2000, 16})
    ->Args({2000, 1})
    ->Args({256, 16});

}  // namespace

BENCHMARK_MAIN();
