// autograd-mlp: trains an MLP classifier with autograd_lite on one training thread (the kernels
// use LOOM_AUTOGRAD_THREADS threads, default: the CPUs this process may run on).
//
// Data: --x (float32 [N, D] .npy) and --y (int64 [N] .npy), or, without them, a synthetic task
// (--classes Gaussian clusters in --dim dimensions). Prints the loss and accuracy per epoch and
// the training speed; --save writes the weights as safetensors (PyTorch's Sequential names),
// --load starts from such a file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>

#include "loom/autograd/autograd.h"
#include "loom/autograd/parallel.h"
#include "loom/cli/checks.h"
#include "loom/common/settings.h"

using namespace loom::ag;

namespace {

struct Data {
  Tensor x, y;
};

Data synthetic(int64_t n, int64_t dim, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  Tensor centers = randn({classes, dim}, gen);
  Data d{empty({n, dim}), empty({n}, DType::kInt64)};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(gen.nextU64() % static_cast<uint64_t>(classes));
    d.y.data<int64_t>()[i] = c;
    for (int64_t j = 0; j < dim; ++j) {
      d.x.data<float>()[i * dim + j] =
          static_cast<float>(centers.data<float>()[c * dim + j] + 1.5 * gen.normal());
    }
  }
  return d;
}

// Rows [begin, begin + count) of a row-major tensor, copied.
Tensor rows(const Tensor& t, int64_t begin, int64_t count) {
  Shape s = t.shape();
  const int64_t rowElems = t.numel() / s[0];
  s[0] = count;
  Tensor out = empty(s, t.dtype());
  const size_t rowBytes = static_cast<size_t>(rowElems) * dtypeSize(t.dtype());
  std::memcpy(out.rawData(), static_cast<const char*>(t.rawData()) + begin * rowBytes,
              count * rowBytes);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP classifier with autograd_lite"};
  std::string xPath, yPath, savePath, loadPath, optimizer = "sgd";
  int64_t hidden = 1024, layers = 2, batch = 64, epochs = 3, n = 4096, dim = 784, classes = 10;
  double lr = 0.05;
  uint64_t seed = 0;
  app.add_option("--x", xPath, "inputs, float32 [N, D] .npy");
  app.add_option("--y", yPath, "labels, int64 [N] .npy");
  app.add_option("--hidden", hidden, "hidden width")->check(loom::cli::wholeAtLeast(1));
  app.add_option("--layers", layers, "hidden layers")->check(loom::cli::wholeAtLeast(0));
  app.add_option("--batch", batch, "batch size")->check(loom::cli::wholeAtLeast(1));
  app.add_option("--epochs", epochs, "epochs")->check(loom::cli::wholeAtLeast(0));
  app.add_option("--lr", lr, "learning rate");
  app.add_option("--optimizer", optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--seed", seed, "seed for init and synthetic data");
  app.add_option("--samples", n, "synthetic: samples")->check(loom::cli::wholeAtLeast(1));
  app.add_option("--dim", dim, "synthetic: input dimension")->check(loom::cli::wholeAtLeast(1));
  app.add_option("--classes", classes, "synthetic: classes")->check(loom::cli::wholeIn(2, 1000));
  app.add_option("--save", savePath, "write the final weights (safetensors)");
  app.add_option("--load", loadPath, "initial weights (safetensors)");
  CLI11_PARSE(app, argc, argv);

  try {
    setNumThreads(static_cast<int>(loom::settings::integer("LOOM_AUTOGRAD_THREADS").value_or(0)));
    Data data;
    if (!xPath.empty() || !yPath.empty()) {
      if (xPath.empty() || yPath.empty()) throw std::invalid_argument("--x and --y go together");
      data = {loadNpy(xPath), loadNpy(yPath)};
      if (data.x.dim() != 2 || data.x.dtype() != DType::kFloat32) {
        throw std::invalid_argument(xPath + ": expected float32 [N, D], got " +
                                    dtypeName(data.x.dtype()) + " " +
                                    shapeToString(data.x.shape()));
      }
      if (data.y.shape() != Shape{data.x.size(0)} || data.y.dtype() != DType::kInt64) {
        throw std::invalid_argument(yPath + ": expected int64 [" + std::to_string(data.x.size(0)) +
                                    "], got " + dtypeName(data.y.dtype()) + " " +
                                    shapeToString(data.y.shape()));
      }
      classes =
          *std::max_element(data.y.data<int64_t>(), data.y.data<int64_t>() + data.y.numel()) + 1;
    } else {
      data = synthetic(n, dim, classes, seed + 1);
    }
    const int64_t samples = data.x.size(0), inDim = data.x.size(1);

    auto model = std::make_shared<nn::Sequential>();
    int64_t width = inDim;
    for (int64_t l = 0; l < layers; ++l) {
      model->append(
          std::make_shared<nn::Linear>(width, hidden, nn::LinearOptions{.seed = seed + 10 + l}));
      model->append(std::make_shared<nn::ReLU>());
      width = hidden;
    }
    model->append(
        std::make_shared<nn::Linear>(width, classes, nn::LinearOptions{.seed = seed + 99}));
    if (!loadPath.empty()) loadStateDict(*model, loadPath);

    std::unique_ptr<optim::Optimizer> opt;
    if (optimizer == "adam") {
      opt = std::make_unique<optim::Adam>(model->parameters(), lr);
    } else {
      opt =
          std::make_unique<optim::SGD>(model->parameters(), lr, optim::SGDOptions{.momentum = 0.9});
    }
    std::printf("%s\n%lld samples x %lld features, %lld classes, batch %lld, %s lr %g\n",
                model->describe().c_str(), static_cast<long long>(samples),
                static_cast<long long>(inDim), static_cast<long long>(classes),
                static_cast<long long>(batch), optimizer.c_str(), lr);

    const auto start = std::chrono::steady_clock::now();
    int64_t steps = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double lossSum = 0;
      int64_t correct = 0, seen = 0;
      for (int64_t begin = 0; begin + batch <= samples; begin += batch) {
        Tensor xb = rows(data.x, begin, batch), yb = rows(data.y, begin, batch);
        opt->zeroGrad();
        Tensor logits = (*model)(xb);
        Tensor loss = crossEntropy(logits, yb);
        loss.backward();
        opt->step();
        ++steps;
        lossSum += loss.item() * static_cast<double>(batch);
        for (int64_t i = 0; i < batch; ++i) {
          const float* row = logits.data<float>() + i * classes;
          correct += (std::max_element(row, row + classes) - row) == yb.data<int64_t>()[i];
        }
        seen += batch;
      }
      std::printf("epoch %lld: loss %.4f, train accuracy %.3f\n", static_cast<long long>(epoch),
                  seen ? lossSum / static_cast<double>(seen) : 0.0,
                  seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0);
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%lld steps in %.2f s: %.1f steps/s\n", static_cast<long long>(steps), secs,
                secs > 0 ? static_cast<double>(steps) / secs : 0.0);
    if (!savePath.empty()) {
      saveStateDict(*model, savePath);
      std::printf("saved %s\n", savePath.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "autograd-mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
