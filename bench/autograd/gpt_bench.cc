// Training steps per second of a small GPT (the "transformer below": byte vocabulary
// 256, context 128, 4 layers, 4 heads, width 128, MLP 4x with GELU, pre-LayerNorm, AdamW),
// batch 8: zeroGrad, forward, cross-entropy over every position, backward, optimizer step.
// LOOM_AUTOGRAD_THREADS threads. torch_gpt_bench.py builds the same model in PyTorch.
#include <benchmark/benchmark.h>

#include <cstdio>

#include "loom/autograd/autograd.h"
#include "loom/common/settings.h"

namespace loom::ag {
namespace {

constexpr int64_t kVocab = 256, kContext = 128, kLayers = 4, kHeads = 4, kWidth = 128, kBatch = 8;

// x + attn(ln1(x)), then x + mlp(ln2(x)); x: [B, T, C].
class Block : public nn::Module {
 public:
  explicit Block(uint64_t seed) {
    ln1_ = std::make_shared<nn::LayerNorm>(kWidth);
    attn_ = std::make_shared<nn::CausalSelfAttention>(kWidth, kHeads,
                                                      nn::CausalSelfAttentionOptions{.seed = seed});
    ln2_ = std::make_shared<nn::LayerNorm>(kWidth);
    fc_ = std::make_shared<nn::Linear>(kWidth, 4 * kWidth, nn::LinearOptions{.seed = seed + 1});
    proj_ = std::make_shared<nn::Linear>(4 * kWidth, kWidth, nn::LinearOptions{.seed = seed + 2});
    registerModule("ln_1", ln1_);
    registerModule("attn", attn_);
    registerModule("ln_2", ln2_);
    registerModule("fc", fc_);
    registerModule("proj", proj_);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + (*attn_)((*ln1_)(x));
    return h + (*proj_)(gelu((*fc_)((*ln2_)(h))));
  }
  std::string describe() const override { return "Block"; }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_, ln2_;
  std::shared_ptr<nn::CausalSelfAttention> attn_;
  std::shared_ptr<nn::Linear> fc_, proj_;
};

// tokens: [B, T] int64 -> logits [B * T, vocab].
class Gpt : public nn::Module {
 public:
  Gpt() {
    wte_ = std::make_shared<nn::Embedding>(kVocab, kWidth, 1);
    wpe_ = std::make_shared<nn::Embedding>(kContext, kWidth, 2);
    registerModule("wte", wte_);
    registerModule("wpe", wpe_);
    for (int64_t i = 0; i < kLayers; ++i) {
      blocks_.push_back(std::make_shared<Block>(10 * (i + 1)));
      registerModule("h" + std::to_string(i), blocks_.back());
    }
    lnF_ = std::make_shared<nn::LayerNorm>(kWidth);
    head_ = std::make_shared<nn::Linear>(kWidth, kVocab, nn::LinearOptions{.bias = false});
    registerModule("ln_f", lnF_);
    registerModule("lm_head", head_);
    std::vector<int64_t> pos(kContext);
    for (int64_t t = 0; t < kContext; ++t) pos[t] = t;
    positions_ = fromVector(pos);
  }
  Tensor forward(const Tensor& tokens) override {
    Tensor x = (*wte_)(tokens) + (*wpe_)(positions_);  // [B, T, C] + [T, C]
    for (auto& b : blocks_) x = (*b)(x);
    return (*head_)((*lnF_)(x)).reshape({-1, kVocab});
  }
  std::string describe() const override { return "Gpt"; }

 private:
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::LayerNorm> lnF_;
  std::shared_ptr<nn::Linear> head_;
  Tensor positions_;
};

void BM_GptTrainStepAdamW(benchmark::State& state) {
  Gpt model;
  optim::AdamW opt(model.parameters(), 3e-4);
  Generator gen(7);
  std::vector<int64_t> tokens(kBatch * kContext), targets(kBatch * kContext);
  for (auto& t : tokens) t = static_cast<int64_t>(gen.nextU64() % kVocab);
  for (auto& t : targets) t = static_cast<int64_t>(gen.nextU64() % kVocab);
  Tensor x = fromVector(tokens, {kBatch, kContext}), y = fromVector(targets);
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
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBatch * kContext), benchmark::Counter::kIsRate);
  state.counters["threads"] = numThreads();
}

BENCHMARK(BM_GptTrainStepAdamW)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0)
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
