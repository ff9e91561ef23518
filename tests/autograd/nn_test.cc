// nn modules: PyTorch's names, init, train/eval, BatchNorm statistics, replacing children,
// and a small model checked against PyTorch's outputs and gradients (fixtures/small_model.*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_util.h"

namespace loom::ag {
namespace {

using nn::Module;
using nn::NamedTensors;

std::vector<std::string> names(const NamedTensors& ts) {
  std::vector<std::string> out;
  for (const auto& [n, t] : ts) out.push_back(n);
  return out;
}

std::shared_ptr<nn::Sequential> smallModel() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::BatchNorm1d>(4),
      std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(4, 2),
      std::make_shared<nn::Tanh>()});
}

TEST(Nn, NamesMatchPyTorch) {
  auto model = smallModel();
  EXPECT_EQ(
      names(model->namedParameters()),
      (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(names(model->namedBuffers()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  const auto ref = test_util::loadJson("small_model.json");
  EXPECT_EQ(names(model->stateDict()), ref["state_names"].get<std::vector<std::string>>());
  EXPECT_EQ(model->namedModules().size(), 6u);
  EXPECT_EQ(model->namedModules()[2].first, "1");
}

TEST(Nn, SharedModuleIsListedOnceAmongParameters) {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential model({shared, std::make_shared<nn::ReLU>(), shared});
  EXPECT_EQ(names(model.namedParameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(names(model.stateDict()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
}

TEST(Nn, LinearInitIsPyTorchsBoundAndSeeded) {
  nn::Linear a(100, 50, {.seed = 3}), b(100, 50, {.seed = 3}), c(100, 50, {.seed = 4});
  EXPECT_EQ(a.weight().shape(), (Shape{50, 100}));
  EXPECT_EQ(a.bias().shape(), (Shape{50}));
  EXPECT_EQ(a.weight().toVector<float>(), b.weight().toVector<float>());
  EXPECT_NE(a.weight().toVector<float>(), c.weight().toVector<float>());
  float lo = 1, hi = -1;
  for (float v : a.weight().toVector<float>()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -0.1f);
  EXPECT_LE(hi, 0.1f);
  EXPECT_LT(lo, -0.09f);
  EXPECT_GT(hi, 0.09f);
  EXPECT_TRUE(a.weight().requiresGrad());
  EXPECT_TRUE(a.weight().isLeaf());
}

TEST(Nn, TrainEvalAndDropout) {
  auto drop = std::make_shared<nn::Dropout>(0.5, 11);
  nn::Sequential model({std::make_shared<nn::Linear>(4, 4), drop});
  EXPECT_TRUE(drop->isTraining());
  model.eval();
  EXPECT_FALSE(drop->isTraining());
  Tensor x = ones({8, 4});
  Tensor y1 = drop->forward(x);
  EXPECT_TRUE(y1.is(x)) << "dropout is the identity in eval";
  model.train();
  Tensor y2 = drop->forward(x);
  int zeros = 0;
  for (float v : y2.toVector<float>()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    zeros += v == 0.0f;
  }
  EXPECT_GT(zeros, 4);
  EXPECT_LT(zeros, 28);
}

TEST(Nn, ReplaceChildKeepsPositionAndName) {
  auto model = smallModel();
  auto replacement = std::make_shared<nn::BatchNorm1d>(4, nn::BatchNorm1dOptions{.momentum = 0.2});
  auto old = model->replace(1, replacement);
  EXPECT_TRUE(std::dynamic_pointer_cast<nn::BatchNorm1d>(old) != nullptr);
  EXPECT_EQ(model->at(1), replacement);
  EXPECT_EQ(names(model->stateDict())[4], "1.running_mean");
  EXPECT_THROW(model->replace(9, replacement), std::invalid_argument);
  EXPECT_THROW(model->replaceChild("x", replacement), std::invalid_argument);
}

TEST(Nn, LoadStateDictNamesTheCulprit) {
  auto model = smallModel();
  NamedTensors state = model->stateDict();
  auto expectMessage = [&](const NamedTensors& s, const std::string& needle) {
    try {
      model->loadStateDict(s);
      FAIL() << "expected an error containing " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  NamedTensors missing(state.begin() + 1, state.end());
  expectMessage(missing, "missing '0.weight'");
  NamedTensors extra = state;
  extra.emplace_back("5.weight", zeros({1}));
  expectMessage(extra, "unexpected '5.weight'");
  NamedTensors wrongShape = state;
  wrongShape[2].second = zeros({5});
  expectMessage(wrongShape, "'1.weight' has shape [5], expected [4]");
  NamedTensors wrongType = state;
  wrongType[6].second = zeros({}, DType::kFloat32);
  expectMessage(wrongType, "'1.num_batches_tracked' has dtype float32, expected int64");
  model->loadStateDict(missing, /*strict=*/false);
}

// Runs the fixture model through our implementation with PyTorch's weights.
TEST(Nn, SmallModelMatchesPyTorch) {
  const auto ref = test_util::loadJson("small_model.json");
  auto model = smallModel();
  loadStateDict(*model, test_util::fixturePath("small_model.safetensors"));
  Tensor x = fromVector(ref["input"].get<std::vector<float>>(), {5, 3}).setRequiresGrad();
  model->train();
  Tensor y = (*model)(x);
  Tensor w = fromVector(ref["output_weights"].get<std::vector<float>>(), {5, 2});
  sum(y * w).backward();
  auto expectNear = [](const Tensor& t, const nlohmann::json& j, const std::string& what) {
    const auto want = j.get<std::vector<double>>();
    ASSERT_EQ(static_cast<size_t>(t.numel()), want.size()) << what;
    const double err = test_util::maxAbsDiff(t.data<float>(), want);
    EXPECT_LE(err, 1e-5 * std::max(1.0, test_util::maxAbs(want))) << what << " max diff " << err;
  };
  expectNear(y, ref["train_output"], "train output");
  expectNear(x.grad(), ref["input_grad"], "input grad");
  for (auto& [name, p] : model->namedParameters()) expectNear(p.grad(), ref["grads"][name], name);
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm1d>(model->at(1));
  expectNear(bn->runningMean(), ref["running_mean"], "running_mean");
  expectNear(bn->runningVar(), ref["running_var"], "running_var");
  EXPECT_EQ(bn->numBatchesTracked().item(), ref["num_batches_tracked"].get<double>());
  model->eval();
  NoGradGuard ng;
  expectNear((*model)(x), ref["eval_output"], "eval output");
}

TEST(Nn, EmbeddingShapes) {
  nn::Embedding emb(10, 4, 1);
  Tensor out = emb(fromVector(std::vector<int64_t>{1, 2, 9, 1, 0, 0}, {2, 3}));
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
  EXPECT_THROW(emb(fromVector(std::vector<int64_t>{10})), std::invalid_argument);
  sum(out).backward();
  // Row 1 and row 0 were used twice, row 2 and 9 once, the rest never.
  const auto g = emb.weight().grad().toVector<float>();
  EXPECT_EQ(g[1 * 4], 2.0f);
  EXPECT_EQ(g[0 * 4], 2.0f);
  EXPECT_EQ(g[9 * 4], 1.0f);
  EXPECT_EQ(g[5 * 4], 0.0f);
}

}  // namespace
}  // namespace loom::ag

namespace loom::ag {
namespace {

// End to end: an MLP with BatchNorm and Dropout learns three Gaussian blobs with Adam and a
// cosine schedule, and an Embedding model learns a lookup table with SGD.
TEST(Training, MlpLearnsBlobs) {
  Generator gen(21);
  const int64_t n = 240;
  const double centers[3][2] = {{-2, 0}, {2, 0}, {0, 2.5}};
  Tensor x = empty({n, 2});
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = i % 3;
    x.data<float>()[2 * i] = static_cast<float>(centers[i % 3][0] + 0.6 * gen.normal());
    x.data<float>()[2 * i + 1] = static_cast<float>(centers[i % 3][1] + 0.6 * gen.normal());
  }
  Tensor y = fromVector(labels);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(2, 32, nn::LinearOptions{.seed = 1}),
      std::make_shared<nn::BatchNorm1d>(32), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Dropout>(0.1, 5),
      std::make_shared<nn::Linear>(32, 3, nn::LinearOptions{.seed = 2})});
  optim::AdamW opt(model->parameters(), 0.05);
  optim::CosineAnnealingLR sched(opt, 150);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    opt.zeroGrad();
    Tensor loss = crossEntropy((*model)(x), y);
    loss.backward();
    opt.step();
    sched.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.25 * first) << "loss " << first << " -> " << last;
  model->eval();
  NoGradGuard ng;
  Tensor logits = (*model)(x);
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + 3 * i;
    const int64_t pred = std::max_element(row, row + 3) - row;
    correct += pred == labels[i];
  }
  EXPECT_GE(correct, static_cast<int>(0.95 * n)) << correct << " of " << n;
}

TEST(Training, EmbeddingLearnsTargets) {
  nn::Embedding emb(5, 3, 2);
  Tensor idx = fromVector(std::vector<int64_t>{0, 1, 2, 3, 4, 2});
  Tensor target =
      fromVector(std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1}, {6, 3});
  optim::SGD opt(emb.parameters(), 1.0, {.momentum = 0.5});
  double loss = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zeroGrad();
    Tensor l = mseLoss(emb(idx), target);
    l.backward();
    opt.step();
    loss = l.item();
  }
  EXPECT_LT(loss, 1e-4);
}

}  // namespace
}  // namespace loom::ag
