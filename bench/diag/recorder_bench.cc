// The flight recorder's cost per operation: what an 8-byte shm all-reduce pays for it
// (docs/diagnostics.md, Cost). The three calls one operation makes, each alone, and the clock
// reads they are made of, so that a profile can be read against its parts.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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

// The same for a group that runs its collectives in issue order (the comm backend): start and
// end go to the progress words while the tick is published. Arg: preciseEvery.
void BM_RecordOperationInOrder(benchmark::State& state) {
  FlightRecorder rec(2000, loom::comm::Algorithm::kAuto);
  rec.setPreciseEvery(static_cast<uint64_t>(state.range(0)));
  rec.setCollectivesInOrder(true);
  rec.publishTick(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch() /
                                        std::chrono::nanoseconds(1)));
  OpDesc op = allreduce();
  for (auto _ : state) {
    ++op.seq;
    op.recordId = rec.recordIssue(op, &op.recordInOrder);  // as ProcessGroup::postLocked
    rec.recordStart(op);
    rec.recordEnd(op, false);
    benchmark::DoNotOptimize(op.recordId);
  }
}
BENCHMARK(BM_RecordOperationInOrder)->Arg(16)->Arg(64);

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

// The recorder's cost per operation as a paired difference: two groups in one process, the
// recorder off in one and on in the other, timed in alternating blocks of `kBlock`
// all-reduces. This machine's speed drifts by 10% between runs of a few seconds (a VM on a
// shared host), far more than the few nanoseconds measured, and BM_GroupAllreduceWorld1's
// separate runs see that drift; blocks a few hundred microseconds apart see the same machine.
// Reported: the median over blocks of (on - off) per operation, and its 10th and 90th
// percentiles, in nanoseconds (counters), and the median "off" time per operation. Arg:
// preciseEvery of the "on" group; 0: the control, both groups off.
void BM_RecorderCostPaired(benchmark::State& state) {
  constexpr int kBlock = 2000;
  auto storeOff = std::make_shared<loom::HashStore>();
  auto storeOn = std::make_shared<loom::HashStore>();
  loom::ProcessGroupOptions off;
  off.flightRecorderEntries = 0;
  loom::ProcessGroupOptions on;
  // 0: the recorder off in both, the control (what the pairing itself measures).
  if (state.range(0) == 0) {
    on.flightRecorderEntries = 0;
  } else {
    on.flightRecorderPreciseEvery = static_cast<int>(state.range(0));
  }
  auto pgOff = loom::createProcessGroup("tcp", storeOff, 0, 1, off);
  auto pgOn = loom::createProcessGroup("tcp", storeOn, 0, 1, on);
  float x[2] = {1, 2};
  const loom::BufferView v{x, 2, loom::DType::kFloat32, loom::Device::cpu()};
  const auto block = [&](loom::ProcessGroup& pg) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBlock; ++i) pg.allreduce(v)->wait();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
           kBlock;
  };
  std::vector<double> diffs;
  std::vector<double> offs;
  bool onFirst = false;
  for (auto _ : state) {
    // Alternate which goes first, so that a block's position in the pair cancels too.
    double tOff = 0;
    double tOn = 0;
    if (onFirst) {
      tOn = block(*pgOn);
      tOff = block(*pgOff);
    } else {
      tOff = block(*pgOff);
      tOn = block(*pgOn);
    }
    onFirst = !onFirst;
    diffs.push_back(tOn - tOff);
    offs.push_back(tOff);
  }
  const auto quantile = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
  };
  state.counters["diff_ns_p10"] = quantile(diffs, 0.1);
  state.counters["diff_ns_median"] = quantile(diffs, 0.5);
  state.counters["diff_ns_p90"] = quantile(diffs, 0.9);
  state.counters["off_ns_median"] = quantile(offs, 0.5);
  state.SetLabel("per operation; pairs of " + std::to_string(kBlock) + "-operation blocks");
}
BENCHMARK(BM_RecorderCostPaired)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1048576)
    ->Arg(1)
    ->Arg(0)
    ->Iterations(2000)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
