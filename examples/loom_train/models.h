// The models loom-train trains besides its MLP: `--model gpt` (a character-level transformer on
// a text file) and `--model cnn` (a small conv net on 8x8 digit images). Each is a Task: it owns
// the model and its data, fills a training batch from the row indices the DistributedSampler
// gives, computes the loss, and evaluates on its validation split with every rank taking a
// contiguous block of it (SequentialDistributedSampler, gatherInOrder).
//
// Parameter names are PyTorch's for the same module tree (gpt: wte.weight, wpe.weight,
// h.0.ln_1.weight, h.0.attn.qkv.weight, ..., lm_head.weight; cnn: 0.weight, 0.bias, 3.weight,
// ...), so checkpoints and --init-weights are safetensors files PyTorch can read and write.
// evaluate() is collective (every rank calls it at the same step); finish() runs on every rank
// and prints on rank 0 only. Not thread-safe.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/autograd/nn.h"
#include "loom/autograd/tensor.h"
#include "loom/process_group/process_group.h"

namespace loom::train {

struct ModelArgs {
  // gpt
  // Comma-separated files, concatenated: by default eight files of Debian's fortunes package
  // (quotations, poems and songs; 868 KB of English text).
  std::string text =
      "/usr/share/games/fortunes/songs-poems,/usr/share/games/fortunes/literature,"
      "/usr/share/games/fortunes/people,/usr/share/games/fortunes/wisdom,"
      "/usr/share/games/fortunes/art,/usr/share/games/fortunes/work,"
      "/usr/share/games/fortunes/science,/usr/share/games/fortunes/humorists";
  int64_t layers = 4, heads = 4, width = 128, context = 128;
  double valFraction = 0.1;
  int64_t sampleChars = 400;
  double temperature = 0.8;
  // cnn
  std::string dataDir;
  // both
  int64_t evalEvery = 0;  // 0: at the end only
  int64_t evalBatch = 64;
};

// Registers the gpt/cnn flags on app (shown under their own group).
void addModelOptions(CLI::App& app, ModelArgs& args);

// "" when every flag given on app belongs to `model` (mlp, gpt or cnn), otherwise a message
// naming the first one that does not ("--text is for --model gpt, not --model cnn").
std::string misplacedFlag(const CLI::App& app, const std::string& model);

struct EvalResult {
  double loss = 0;       // mean per-token (gpt) or per-image (cnn) cross-entropy
  double accuracy = -1;  // cnn: fraction of images classified right; gpt: -1
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::shared_ptr<ag::nn::Module> model() const = 0;
  // Rows the training sampler draws from.
  virtual int64_t trainRows() const = 0;
  // Fresh batch tensors for `batch` rows (x: the model's input, y: its targets).
  virtual ag::Tensor makeInputs(int64_t batch) const = 0;
  virtual ag::Tensor makeTargets(int64_t batch) const = 0;
  virtual void fillBatch(const std::vector<int64_t>& rows, ag::Tensor& x, ag::Tensor& y) const = 0;
  // output: model(x); y: the targets of fillBatch. A 0-d mean loss.
  virtual ag::Tensor loss(const ag::Tensor& output, const ag::Tensor& y) const = 0;
  // Collective: the validation split spread over pg's ranks; the same result on every rank.
  virtual EvalResult evaluate(ProcessGroup& pg) = 0;
  // "validation loss 1.2345" or "validation loss 0.1234 accuracy 97.50%".
  virtual std::string describe(const EvalResult& result) const = 0;
  // After training: the gpt prints sampled text on rank 0.
  virtual void finish(int rank) { (void)rank; }
};

// name: "gpt" or "cnn"; seed seeds the weights (and the gpt's sampling).
std::unique_ptr<Task> makeTask(const std::string& name, const ModelArgs& args, uint64_t seed);

// Defaults a model brings when the flag was not given: optimizer, learning rate, batch.
struct ModelDefaults {
  std::string optimizer;
  double lr;
  int64_t batch;
};
ModelDefaults modelDefaults(const std::string& name);

}  // namespace loom::train
