// Tensor basics and the engine: accumulation, graph freeing, grad mode, hooks and their order.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace loom::ag {
namespace {

TEST(Tensor, FactoriesViewsAndErrors) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dtype(), DType::kFloat32);
  EXPECT_EQ(full({2}, 1.5, DType::kFloat64).toVector<double>(), (std::vector<double>{1.5, 1.5}));
  Tensor v = fromVector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = v.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.rawData(), v.rawData()) << "reshape of a contiguous tensor is a view";
  EXPECT_EQ(scalarTensor(4.0).item(), 4.0);
  EXPECT_THROW(v.reshape({4, 2}), std::invalid_argument);
  EXPECT_THROW(v.item(), std::invalid_argument);
  EXPECT_THROW(v.data<double>(), std::invalid_argument);
  EXPECT_THROW(fromVector(std::vector<float>{1, 2, 3}, {2, 2}), std::invalid_argument);
  EXPECT_THROW(Tensor().shape(), std::invalid_argument);
  try {
    add(zeros({2, 3}), zeros({4}));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] and [4]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add(zeros({2}), zeros({2}, DType::kFloat64)), std::invalid_argument);
  EXPECT_THROW(matmul(zeros({2, 3}), zeros({2, 3})), std::invalid_argument);
}

TEST(Tensor, SeededGeneratorIsDeterministic) {
  Generator a(42), b(42), c(43);
  Tensor x = randn({100}, a), y = randn({100}, b), z = randn({100}, c);
  EXPECT_EQ(x.toVector<float>(), y.toVector<float>());
  EXPECT_NE(x.toVector<float>(), z.toVector<float>());
  double m = 0, s = 0;
  Generator g(1);
  Tensor big = randn({20000}, g, DType::kFloat64);
  for (double v : big.toVector<double>()) {
    m += v;
    s += v * v;
  }
  EXPECT_NEAR(m / 20000, 0.0, 0.03);
  EXPECT_NEAR(s / 20000, 1.0, 0.05);
  Tensor u = uniform({1000}, -2, 3, g);
  for (float v : u.toVector<float>()) {
    EXPECT_GE(v, -2.0f);
    EXPECT_LT(v, 3.0f);
  }
}

TEST(Engine, AccumulatesAcrossUsesAndCalls) {
  Tensor x = fromVector(std::vector<double>{1.0, -2.0, 3.0}).setRequiresGrad();
  // y = sum(x*x + x): dy/dx = 2x + 1, x used three times.
  sum(x * x + x).backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{3.0, -3.0, 7.0}));
  sum(x).backward();  // accumulates
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{4.0, -2.0, 8.0}));
  const void* buffer = x.grad().rawData();
  x.zeroGrad();
  EXPECT_EQ(x.grad().rawData(), buffer) << "zeroGrad keeps the buffer";
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0, 0, 0}));
  sum(x).backward();
  EXPECT_EQ(x.grad().rawData(), buffer) << "accumulation is in place";
  x.zeroGrad(true);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Engine, GradientsDoNotAliasBetweenLeaves) {
  Tensor a = zeros({3}).setRequiresGrad(), b = zeros({3}).setRequiresGrad();
  sum(a + b).backward();  // add passes the same gradient to both inputs
  a.grad().fill(5.0);
  EXPECT_EQ(b.grad().toVector<float>(), (std::vector<float>{1, 1, 1}));
}

TEST(Engine, GraphIsFreedAfterBackward) {
  Tensor x = ones({2}).setRequiresGrad();
  Tensor y = x * 2.0;
  Tensor loss = sum(y);
  std::weak_ptr<Node> node = y.gradFn();
  loss.backward();
  EXPECT_TRUE(y.gradFn()->released());
  EXPECT_TRUE(loss.gradFn()->inputs().empty());
  try {
    loss.backward();
    FAIL() << "second backward should throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Engine, NoGradGuardAndErrors) {
  Tensor x = ones({2}).setRequiresGrad();
  {
    NoGradGuard guard;
    Tensor y = x * 3.0;
    EXPECT_FALSE(y.requiresGrad());
    EXPECT_FALSE(gradEnabled());
  }
  EXPECT_TRUE(gradEnabled());
  EXPECT_THROW(ones({2}).backward(), std::invalid_argument);  // does not require grad
  EXPECT_THROW((x * 2.0).backward(), std::invalid_argument);  // not one element, no gradient
  Tensor y = x * 2.0;
  y.backward(fromVector(std::vector<float>{1.0f, 10.0f}));
  EXPECT_EQ(x.grad().toVector<float>(), (std::vector<float>{2, 20}));
  EXPECT_THROW(y.setRequiresGrad(false), std::invalid_argument);
  EXPECT_THROW(zeros({2}).registerGradReadyHook([](Tensor&) {}), std::invalid_argument);
}

TEST(Engine, HookFiresOnceAfterFullAccumulation) {
  Tensor w = fromVector(std::vector<double>{2.0}).setRequiresGrad();
  Tensor unused = zeros({1}, DType::kFloat64).setRequiresGrad();
  int calls = 0, unusedCalls = 0;
  double seen = 0;
  w.registerGradReadyHook([&](Tensor& g) {
    ++calls;
    seen = g.item();
  });
  unused.registerGradReadyHook([&](Tensor&) { ++unusedCalls; });
  // loss = w*3 + w*w*5 + sum(w): three separate paths into w. dloss/dw = 3 + 10w + 1 = 24.
  Tensor loss = sum(w * 3.0 + w * w * 5.0) + sum(w);
  loss.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 24.0);
  EXPECT_EQ(unusedCalls, 0) << "unreached leaves do not fire";
  // Second pass: fires again, with the accumulated value.
  sum(w).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen, 25.0);
}

TEST(Engine, HookMayRewriteGradAndCanBeRemoved) {
  Tensor w = ones({3}).setRequiresGrad();
  HookHandle h = w.registerGradReadyHook([](Tensor& g) {
    float* p = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) p[i] *= 0.5f;
  });
  sum(w * 4.0).backward();
  EXPECT_EQ(w.grad().toVector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_TRUE(w.removeGradReadyHook(h));
  EXPECT_FALSE(w.removeGradReadyHook(h));
  w.zeroGrad();
  sum(w * 4.0).backward();
  EXPECT_EQ(w.grad().toVector<float>(), (std::vector<float>{4, 4, 4}));
}

// linear's weight and bias gradients go straight into existing grad buffers (the engine's
// "sinks"); the values, the accumulation and the hooks must be the same as without.
TEST(Engine, LinearAccumulatesIntoExistingGradBuffers) {
  Generator gen(4);
  Tensor x = randn({5, 3}, gen, DType::kFloat64);
  nn::Linear lin(3, 4, {.seed = 9});
  Tensor w = lin.weight(), b = lin.bias();
  // float64 copies of the parameters, so the reference is computed in the same precision.
  Tensor w64 = w.to(DType::kFloat64).setRequiresGrad(),
         b64 = b.to(DType::kFloat64).setRequiresGrad();
  auto lossOf = [&](const Tensor& ww, const Tensor& bb) {
    return sum(tanh(linear(x, ww, bb)) * 3.0);
  };
  lossOf(w64, b64).backward();  // first pass: fresh buffers
  const auto refW = w64.grad().toVector<double>(), refB = b64.grad().toVector<double>();
  const void* bufW = w64.grad().rawData();
  int fired = 0;
  double seenFirst = 0;
  w64.registerGradReadyHook([&](Tensor& g) {
    ++fired;
    seenFirst = g.data<double>()[0];
  });
  w64.zeroGrad();
  lossOf(w64, b64).backward();  // second pass: accumulates into the zeroed buffers
  EXPECT_EQ(w64.grad().rawData(), bufW);
  EXPECT_EQ(fired, 1);
  EXPECT_DOUBLE_EQ(seenFirst, refW[0]);
  for (size_t i = 0; i < refW.size(); ++i)
    EXPECT_NEAR(w64.grad().data<double>()[i], refW[i], 1e-12);
  for (size_t i = 0; i < refB.size(); ++i) {
    EXPECT_NEAR(b64.grad().data<double>()[i], 2 * refB[i], 1e-12) << "bias was not zeroed";
  }
  lossOf(w64, b64).backward();  // third pass: plain accumulation
  for (size_t i = 0; i < refW.size(); ++i) {
    EXPECT_NEAR(w64.grad().data<double>()[i], 2 * refW[i], 1e-12);
  }
  // A weight used twice in one graph gets no sink; the sum must still be right.
  w64.zeroGrad();
  (lossOf(w64, b64) + lossOf(w64, b64)).backward();
  for (size_t i = 0; i < refW.size(); ++i) {
    EXPECT_NEAR(w64.grad().data<double>()[i], 2 * refW[i], 1e-12);
  }
  EXPECT_EQ(fired, 3);
}

TEST(Engine, QueuedCallbacksRunAfterTheWholePass) {
  Tensor a = ones({2}).setRequiresGrad(), b = ones({2}).setRequiresGrad();
  std::vector<std::string> events;
  a.registerGradReadyHook([&](Tensor&) {
    events.push_back("hook a");
    queueCallback([&] {
      events.push_back("callback");
      EXPECT_TRUE(inBackward());
      EXPECT_TRUE(b.grad().defined()) << "runs after every leaf is done";
      queueCallback([&] { events.push_back("nested callback"); });
    });
  });
  b.registerGradReadyHook([&](Tensor&) { events.push_back("hook b"); });
  sum(a * 2.0 + b * 3.0).backward();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2], "callback");
  EXPECT_EQ(events[3], "nested callback");
  EXPECT_FALSE(inBackward());
  EXPECT_THROW(queueCallback([] {}), std::invalid_argument);
}

TEST(Engine, HooksFireInReverseLayerOrder) {
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 8, nn::LinearOptions{.seed = 1}),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 8, nn::LinearOptions{.seed = 2}),
      std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(8, 3, nn::LinearOptions{.seed = 3})});
  std::vector<std::string> order;
  for (auto& [name, p] : model->namedParameters()) {
    p.registerGradReadyHook([&order, name = name](Tensor&) { order.push_back(name); });
  }
  Generator gen(5);
  Tensor loss = crossEntropy((*model)(randn({6, 4}, gen)),
                             fromVector(std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  loss.backward();
  ASSERT_EQ(order.size(), 6u);
  auto pos = [&](const std::string& n) {
    return std::find(order.begin(), order.end(), n) - order.begin();
  };
  EXPECT_LT(pos("4.weight"), pos("2.weight"));
  EXPECT_LT(pos("4.bias"), pos("2.bias"));
  EXPECT_LT(pos("2.weight"), pos("0.weight"));
  EXPECT_LT(pos("2.bias"), pos("0.bias"));
}

}  // namespace
}  // namespace loom::ag
