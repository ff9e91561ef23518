#include "models.h"

#include <algorithm>
#include <cmath>

#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/ddp/eval.h"
#include "loom/ddp/sampler.h"
#include "model_tasks.h"

namespace loom::train {

void addModelOptions(CLI::App& app, ModelArgs& a) {
  const std::string gpt = "gpt (--model gpt)", cnn = "cnn (--model cnn)", both = "gpt and cnn";
  app.add_option("--text", a.text,
                 "gpt: text files, comma-separated, concatenated; the last --val-fraction is the "
                 "validation split")
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--layers", a.layers, "gpt: transformer blocks")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--heads", a.heads, "gpt: attention heads")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--width", a.width, "gpt: embedding width")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--context", a.context, "gpt: context length (characters)")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--val-fraction", a.valFraction, "gpt: the share of the text kept for validation")
      ->check(cli::numberIn(0, 1))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--sample-chars", a.sampleChars, "gpt: characters sampled at the end (0: none)")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--temperature", a.temperature, "gpt: sampling temperature")
      ->check(cli::numberAbove(0))
      ->capture_default_str()
      ->group(gpt);
  app.add_option("--data-dir", a.dataDir,
                 "cnn: directory of digits_{train,val}_{x,y}.npy "
                 "(examples/loom_train/data/make_digits.py writes them)")
      ->group(cnn);
  app.add_option("--eval-every", a.evalEvery, "steps between validation passes (0: at the end)")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str()
      ->group(both);
  app.add_option("--eval-batch", a.evalBatch, "rows per validation forward")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str()
      ->group(both);
}

std::string misplacedFlag(const CLI::App& app, const std::string& model) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> owners = {
      {"--text", {"gpt"}},
      {"--layers", {"gpt"}},
      {"--heads", {"gpt"}},
      {"--width", {"gpt"}},
      {"--context", {"gpt"}},
      {"--val-fraction", {"gpt"}},
      {"--sample-chars", {"gpt"}},
      {"--temperature", {"gpt"}},
      {"--data-dir", {"cnn"}},
      {"--eval-every", {"gpt", "cnn"}},
      {"--eval-batch", {"gpt", "cnn"}},
      {"--in", {"mlp"}},
      {"--classes", {"mlp"}},
      {"--hidden", {"mlp"}},
      {"--data", {"mlp"}},
      {"--labels", {"mlp"}},
      {"--samples", {"mlp"}}};
  for (const auto& [flag, models] : owners) {
    if (app.count(flag) == 0 || std::find(models.begin(), models.end(), model) != models.end()) {
      continue;
    }
    std::string list;
    for (const auto& m : models) list += (list.empty() ? "--model " : " or --model ") + m;
    return std::string(flag) + " is for " + list + ", not --model " + model;
  }
  return "";
}

std::unique_ptr<Task> makeTask(const std::string& name, const ModelArgs& args, uint64_t seed) {
  LOOM_CHECK(args.evalEvery >= 0 && args.evalBatch >= 1,
             "--eval-every must be >= 0 and --eval-batch >= 1");
  if (name == "gpt") return makeGptTask(args, seed);
  if (name == "cnn") return makeCnnTask(args, seed);
  LOOM_THROW(InvalidArgumentError, "--model: '", name, "' is not one of mlp, gpt, cnn");
}

ModelDefaults modelDefaults(const std::string& name) {
  if (name == "gpt") return {"adamw", 3e-3, 16};
  if (name == "cnn") return {"adamw", 3e-3, 32};
  return {"sgd", 0.01, 64};
}

EvalResult evaluateSplit(ProcessGroup& pg, int64_t items, int64_t batch,
                         const std::function<void(const std::vector<int64_t>&, double*)>& score) {
  const ddp::SequentialDistributedSampler sampler(items, pg.size(), pg.rank());
  const std::vector<int64_t> indices = sampler.indices();
  // local: per item (loss, correct), this rank's block of the validation split.
  ag::Tensor local = ag::zeros({sampler.numSamples(), 2}, ag::DType::kFloat64);
  for (size_t begin = 0; begin < indices.size(); begin += static_cast<size_t>(batch)) {
    const size_t end = std::min(indices.size(), begin + static_cast<size_t>(batch));
    score(std::vector<int64_t>(indices.begin() + begin, indices.begin() + end),
          local.data<double>() + 2 * begin);
  }
  const ag::Tensor all = ddp::gatherInOrder(pg, local, items);
  EvalResult result;
  double correct = 0;
  for (int64_t i = 0; i < items; ++i) {
    result.loss += all.data<double>()[2 * i];
    correct += all.data<double>()[2 * i + 1];
  }
  result.loss /= static_cast<double>(items);
  result.accuracy = correct / static_cast<double>(items);
  return result;
}

void scoreRows(const float* logits, const int64_t* targets, int64_t rows, int64_t classes,
               double* loss, double* correct) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    double sumExp = 0;
    for (int64_t c = 0; c < classes; ++c) sumExp += std::exp(double{row[c]} - row[best]);
    loss[r] = std::log(sumExp) - (double{row[targets[r]]} - row[best]);
    correct[r] = targets[r] == best ? 1.0 : 0.0;
  }
}

}  // namespace loom::train
