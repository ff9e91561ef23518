// Training steps per second of the MLP 784-1024-1024-10 (ReLU, cross-entropy), batch 64:
// forward, backward, optimizer step, zeroGrad. The kernels use LOOM_AUTOGRAD_THREADS threads
// (default: the CPUs this process may run on). Compare with torch_mlp_bench.py --threads N on
// the same machine (compare.sh runs both, interleaved).
#include <benchmark/benchmark.h>

#include <cstdio>

#include "loom/autograd/autograd.h"
#include "loom/common/settings.h"

namespace loom::ag {
namespace {

constexpr int64_t kBatch = 64;

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 1024, nn::LinearOptions{.seed = 1}),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 1024, nn::LinearOptions{.seed = 2}),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 10, nn::LinearOptions{.seed = 3})});
}

template <class Opt>
void trainStep(benchmark::State& state, Opt& opt, nn::Module& model) {
  Generator gen(7);
  Tensor x = uniform({kBatch, 784}, 0.0, 1.0, gen);
  std::vector<int64_t> labels(kBatch);
  for (auto& y : labels) y = static_cast<int64_t>(gen.nextU64() % 10);
  Tensor y = fromVector(labels);
  double loss = 0;
  for (auto _ : state) {
    opt.zeroGrad();
    Tensor l = crossEntropy(model(x), y);
    l.backward();
    opt.step();
    loss = l.item();
  }
  benchmark::DoNotOptimize(loss);
  state.counters["steps/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(state.iterations() * kBatch),
                                                   benchmark::Counter::kIsRate);
  state.counters["threads"] = loom::ag::numThreads();
}

void BM_MlpTrainStepSgd(benchmark::State& state) {
  auto model = mlp();
  optim::SGD opt(model->parameters(), 0.01, {.momentum = 0.9});
  trainStep(state, opt, *model);
}

void BM_MlpTrainStepAdam(benchmark::State& state) {
  auto model = mlp();
  optim::Adam opt(model->parameters(), 1e-3);
  trainStep(state, opt, *model);
}

void BM_MlpForwardOnly(benchmark::State& state) {
  auto model = mlp();
  Generator gen(7);
  Tensor x = uniform({kBatch, 784}, 0.0, 1.0, gen);
  NoGradGuard ng;
  for (auto _ : state) benchmark::DoNotOptimize((*model)(x).rawData());
}

void BM_Matmul64x1024x1024(benchmark::State& state) {
  Generator gen(1);
  Tensor a = randn({64, 1024}, gen), b = randn({1024, 1024}, gen);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, b).rawData());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * 64 * 1024 * 1024 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["GFLOP/s"].value /= 1e9;
}

// Wall-clock rates (UseRealTime) and the CPU time of the whole process, all threads
// (MeasureProcessCPUTime), as torch_mlp_bench.py reports them.
BENCHMARK(BM_MlpTrainStepSgd)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_MlpTrainStepAdam)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime()
    ->MeasureProcessCPUTime();
BENCHMARK(BM_MlpForwardOnly)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_Matmul64x1024x1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace loom::ag

int main(int argc, char** argv) {
  loom::ag::setNumThreads(
      static_cast<int>(loom::settings::integer("LOOM_AUTOGRAD_THREADS").value_or(0)));
  std::printf("autograd_lite kernels: %d threads (LOOM_AUTOGRAD_THREADS)\n",
              loom::ag::numThreads());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
