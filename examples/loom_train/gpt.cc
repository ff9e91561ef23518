// --model gpt: a character-level GPT on a text file.
//
// Tokens are the text's bytes, renumbered: the vocabulary is the sorted set of distinct bytes
// of the whole text (train and validation), so token i is the i-th smallest byte that occurs.
// The first (1 - valFraction) of the tokens train, the rest validate. A row is a window of
// context + 1 tokens starting at row * context (inputs: the first context, targets: the same
// shifted by one), so rows do not overlap and the sampler shuffles whole windows.
//
// The model is GPT-2's shape with PyTorch's default initializations, names as in this tree:
//   wte: Embedding(vocab, C), wpe: Embedding(context, C),
//   h.i: Block (ln_1: LayerNorm(C), attn: CausalSelfAttention(C, heads) with qkv and proj,
//               ln_2: LayerNorm(C), mlp: fc Linear(C, 4C), GELU, proj Linear(4C, C)),
//   ln_f: LayerNorm(C), lm_head: Linear(C, vocab, no bias) (untied from wte).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/common/error.h"
#include "model_tasks.h"

namespace loom::train {
namespace {

namespace nn = ag::nn;

class Mlp : public nn::Module {
 public:
  Mlp(int64_t width, uint64_t seed) {
    fc_ = std::static_pointer_cast<nn::Linear>(registerModule(
        "fc", std::make_shared<nn::Linear>(width, 4 * width, nn::LinearOptions{true, seed})));
    proj_ = std::static_pointer_cast<nn::Linear>(registerModule(
        "proj", std::make_shared<nn::Linear>(4 * width, width, nn::LinearOptions{true, seed + 1})));
  }
  // x: [B, T, C] -> [B, T, C]
  ag::Tensor forward(const ag::Tensor& x) override { return (*proj_)(ag::gelu((*fc_)(x))); }
  std::string describe() const override { return "Mlp"; }

 private:
  std::shared_ptr<nn::Linear> fc_, proj_;
};

class Block : public nn::Module {
 public:
  Block(int64_t width, int64_t heads, uint64_t seed) {
    ln1_ = registerModule("ln_1", std::make_shared<nn::LayerNorm>(width));
    nn::CausalSelfAttentionOptions ao;
    ao.seed = seed;
    attn_ = registerModule("attn", std::make_shared<nn::CausalSelfAttention>(width, heads, ao));
    ln2_ = registerModule("ln_2", std::make_shared<nn::LayerNorm>(width));
    mlp_ = registerModule("mlp", std::make_shared<Mlp>(width, seed + 10));
  }
  // x: [B, T, C] -> [B, T, C], pre-norm residual.
  ag::Tensor forward(const ag::Tensor& x) override {
    const ag::Tensor h = x + (*attn_)((*ln1_)(x));
    return h + (*mlp_)((*ln2_)(h));
  }
  std::string describe() const override { return "Block"; }

 private:
  std::shared_ptr<nn::Module> ln1_, attn_, ln2_, mlp_;
};

class Gpt : public nn::Module {
 public:
  Gpt(int64_t vocab, const ModelArgs& a, uint64_t seed) : context_(a.context) {
    wte_ = registerModule("wte", std::make_shared<nn::Embedding>(vocab, a.width, seed));
    wpe_ = registerModule("wpe", std::make_shared<nn::Embedding>(a.context, a.width, seed + 1));
    auto blocks = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < a.layers; ++i) {
      blocks->append(
          std::make_shared<Block>(a.width, a.heads, seed + 100 * static_cast<uint64_t>(i + 1)));
    }
    h_ = registerModule("h", blocks);
    lnF_ = registerModule("ln_f", std::make_shared<nn::LayerNorm>(a.width));
    lmHead_ = registerModule("lm_head", std::make_shared<nn::Linear>(
                                            a.width, vocab, nn::LinearOptions{false, seed + 2}));
  }
  // idx: [B, T] int64, T <= context -> logits [B, T, vocab]
  ag::Tensor forward(const ag::Tensor& idx) override {
    const int64_t t = idx.size(1);
    LOOM_CHECK(t <= context_, "gpt: ", t, " tokens exceed the context of ", context_);
    std::vector<int64_t> positions(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) positions[static_cast<size_t>(i)] = i;
    ag::Tensor x = (*wte_)(idx) + (*wpe_)(ag::fromVector(positions));  // [B, T, C] + [T, C]
    return (*lmHead_)((*lnF_)((*h_)(x)));
  }
  std::string describe() const override { return "Gpt"; }

 private:
  int64_t context_;
  std::shared_ptr<nn::Module> wte_, wpe_, h_, lnF_, lmHead_;
};

std::string readText(const std::string& files) {
  std::string text;
  std::stringstream list(files);
  for (std::string path; std::getline(list, path, ',');) {
    if (path.empty()) continue;
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(static_cast<bool>(in), "--text: cannot read '", path,
               "' (expected a text file; the default corpus is Debian's fortunes package: "
               "apt-get install fortunes, or scripts/setup.sh)");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

class GptTask : public Task {
 public:
  GptTask(const ModelArgs& a, uint64_t seed) : args_(a), sampleGen_(seed + 777) {
    LOOM_CHECK(a.layers >= 1 && a.heads >= 1 && a.width >= 1 && a.context >= 1,
               "--layers, --heads, --width and --context must be >= 1");
    LOOM_CHECK(a.width % a.heads == 0, "--width ", a.width, " must be a multiple of --heads ",
               a.heads);
    LOOM_CHECK(a.valFraction > 0 && a.valFraction < 1, "--val-fraction ", a.valFraction,
               " must be in (0, 1)");
    LOOM_CHECK(a.sampleChars >= 0 && a.temperature > 0,
               "--sample-chars must be >= 0 and --temperature > 0");
    LOOM_CHECK(!a.text.empty(), "--model gpt needs --text FILE[,FILE...]");
    const std::string text = readText(a.text);
    bool seen[256] = {};
    for (unsigned char c : text) seen[c] = true;
    int64_t tokenOf[256];
    for (int c = 0; c < 256; ++c) {
      tokenOf[c] = -1;
      if (!seen[c]) continue;
      tokenOf[c] = static_cast<int64_t>(chars_.size());
      chars_.push_back(static_cast<char>(c));
    }
    tokens_.reserve(text.size());
    for (unsigned char c : text) tokens_.push_back(tokenOf[c]);
    const int64_t total = static_cast<int64_t>(tokens_.size());
    trainTokens_ = static_cast<int64_t>(static_cast<double>(total) * (1 - a.valFraction));
    trainRows_ = (trainTokens_ - 1) / a.context;
    valRows_ = (total - trainTokens_ - 1) / a.context;
    LOOM_CHECK(trainRows_ >= 1 && valRows_ >= 1, "--text has ", total,
               " characters: too few for --context ", a.context, " with --val-fraction ",
               a.valFraction, " (each split needs at least context + 1)");
    model_ = std::make_shared<Gpt>(static_cast<int64_t>(chars_.size()), a, seed);
  }

  std::shared_ptr<nn::Module> model() const override { return model_; }
  int64_t trainRows() const override { return trainRows_; }
  ag::Tensor makeInputs(int64_t batch) const override {
    return ag::empty({batch, args_.context}, ag::DType::kInt64);
  }
  ag::Tensor makeTargets(int64_t batch) const override { return makeInputs(batch); }

  void fillBatch(const std::vector<int64_t>& rows, ag::Tensor& x, ag::Tensor& y) const override {
    fillWindows(rows, 0, x.data<int64_t>(), y.data<int64_t>());
  }

  ag::Tensor loss(const ag::Tensor& output, const ag::Tensor& y) const override {
    // output: [B, T, V], y: [B, T]
    const int64_t n = output.size(0) * output.size(1);
    return ag::crossEntropy(ag::view(output, {n, output.size(2)}), ag::view(y, {n}));
  }

  EvalResult evaluate(ProcessGroup& pg) override {
    ag::NoGradGuard noGrad;
    model_->eval();
    const int64_t t = args_.context, vocab = static_cast<int64_t>(chars_.size());
    EvalResult result = evaluateSplit(
        pg, valRows_, args_.evalBatch, [&](const std::vector<int64_t>& rows, double* out) {
          const int64_t b = static_cast<int64_t>(rows.size());
          ag::Tensor x = makeInputs(b), y = makeTargets(b);
          fillWindows(rows, trainTokens_, x.data<int64_t>(), y.data<int64_t>());
          const ag::Tensor logits = (*model_)(x);  // [b, T, V]
          std::vector<double> loss(static_cast<size_t>(t)), correct(static_cast<size_t>(t));
          for (int64_t i = 0; i < b; ++i) {
            scoreRows(logits.data<float>() + i * t * vocab, y.data<int64_t>() + i * t, t, vocab,
                      loss.data(), correct.data());
            double l = 0, c = 0;
            for (int64_t j = 0; j < t; ++j) {
              l += loss[j];
              c += correct[j];
            }
            out[2 * i] = l / static_cast<double>(t);
            out[2 * i + 1] = c / static_cast<double>(t);
          }
        });
    model_->train();
    return result;
  }

  std::string describe(const EvalResult& r) const override {
    char buf[128];
    std::snprintf(buf, sizeof buf,
                  "validation loss %.4f (%.3f bits/char), next-char accuracy %.1f%%", r.loss,
                  r.loss / std::log(2.0), 100 * r.accuracy);
    return buf;
  }

  // Samples on rank 0 from a newline, one character at a time, the context cut to its last
  // `context` characters; probabilities softmax(logits / temperature), drawn from a generator
  // seeded with the run's seed.
  void finish(int rank) override {
    if (rank != 0 || args_.sampleChars == 0) return;
    ag::NoGradGuard noGrad;
    model_->eval();
    const int64_t vocab = static_cast<int64_t>(chars_.size());
    std::vector<int64_t> context;
    for (int64_t i = 0; i < vocab; ++i) {
      if (chars_[static_cast<size_t>(i)] == '\n') context.push_back(i);
    }
    if (context.empty()) context.push_back(0);
    std::string sample;
    std::vector<double> p(static_cast<size_t>(vocab));
    for (int64_t n = 0; n < args_.sampleChars; ++n) {
      const int64_t t = std::min<int64_t>(static_cast<int64_t>(context.size()), args_.context);
      const std::vector<int64_t> window(context.end() - t, context.end());
      const ag::Tensor logits = (*model_)(ag::fromVector(window, {1, t}));
      const float* last = logits.data<float>() + (t - 1) * vocab;
      double maxLogit = last[0], sum = 0;
      for (int64_t c = 1; c < vocab; ++c) maxLogit = std::max<double>(maxLogit, last[c]);
      for (int64_t c = 0; c < vocab; ++c) {
        p[c] = std::exp((last[c] - maxLogit) / args_.temperature);
        sum += p[c];
      }
      double u = sampleGen_.uniform() * sum;
      int64_t next = vocab - 1;
      for (int64_t c = 0; c < vocab; ++c) {
        u -= p[c];
        if (u < 0) {
          next = c;
          break;
        }
      }
      context.push_back(next);
      sample.push_back(chars_[static_cast<size_t>(next)]);
    }
    model_->train();
    std::printf("loom-train: sample (temperature %.2f, %lld characters):\n%s\n", args_.temperature,
                static_cast<long long>(args_.sampleChars), sample.c_str());
    std::fflush(stdout);
  }

 private:
  // Row r of a split starting at token `base`: inputs tokens [base + r T, base + r T + T),
  // targets the next T.
  void fillWindows(const std::vector<int64_t>& rows, int64_t base, int64_t* x, int64_t* y) const {
    const int64_t t = args_.context;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t* src = tokens_.data() + base + rows[i] * t;
      std::copy(src, src + t, x + static_cast<int64_t>(i) * t);
      std::copy(src + 1, src + 1 + t, y + static_cast<int64_t>(i) * t);
    }
  }

  ModelArgs args_;
  std::vector<char> chars_;  // token -> byte
  std::vector<int64_t> tokens_;
  int64_t trainTokens_ = 0, trainRows_ = 0, valRows_ = 0;
  std::shared_ptr<Gpt> model_;
  ag::Generator sampleGen_;
};

}  // namespace

std::unique_ptr<Task> makeGptTask(const ModelArgs& args, uint64_t seed) {
  return std::make_unique<GptTask>(args, seed);
}

}  // namespace loom::train
