// Every op's backward against central finite differences in float64, over random shapes,
// including broadcasting.
#include <gtest/gtest.h>

#include "test_util.h"

namespace loom::ag {
namespace {

using test_util::gradCheck;
using Inputs = std::vector<Tensor>;
constexpr auto kF64 = DType::kFloat64;

class GradCheck : public ::testing::Test {
 protected:
  // A random dimension in [lo, hi].
  int64_t dim(int64_t lo = 1, int64_t hi = 5) {
    return lo + static_cast<int64_t>(gen_.nextU64() % static_cast<uint64_t>(hi - lo + 1));
  }
  Tensor rnd(const Shape& s) { return randn(s, gen_, kF64); }
  // Values bounded away from 0 (for div and log), magnitude in [0.5, 2].
  Tensor positive(const Shape& s) { return uniform(s, 0.5, 2.0, gen_, kF64); }
  Generator gen_{12345};
};

constexpr int kTrials = 4;

TEST_F(GradCheck, BinaryOpsWithBroadcasting) {
  using BinOp = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<const char*, BinOp>> ops = {
      {"add", &add}, {"sub", &sub}, {"mul", &mul}, {"div", &div}};
  for (int t = 0; t < kTrials; ++t) {
    const int64_t b = dim(), m = dim(), n = dim();
    // (a shape, b shape): equal, row vector, scalar, column x row, leading broadcast, 3-d.
    const std::vector<std::pair<Shape, Shape>> cases = {
        {{m, n}, {m, n}}, {{m, n}, {n}},       {{m, n}, {}},           {{n}, {m, n}},
        {{m, 1}, {1, n}}, {{b, m, n}, {m, 1}}, {{1, m, 1}, {b, 1, n}}, {{}, {m}}};
    for (const auto& [name, op] : ops) {
      for (const auto& [sa, sb] : cases) {
        const std::string what =
            std::string(name) + " " + shapeToString(sa) + " " + shapeToString(sb);
        Tensor rhs = std::string(name) == "div" ? positive(sb) : rnd(sb);
        gradCheck(what, [op](const Inputs& in) { return op(in[0], in[1]); }, {rnd(sa), rhs});
      }
    }
  }
}

TEST_F(GradCheck, ScalarOperatorsAndNeg) {
  const Shape s{dim(), dim()};
  gradCheck("x * 3 - 1 / x + 2", [](const Inputs& in) { return in[0] * 3.0 - 1.0 / in[0] + 2.0; },
            {positive(s)});
  gradCheck("-x", [](const Inputs& in) { return -in[0]; }, {rnd(s)});
}

TEST_F(GradCheck, UnaryActivations) {
  for (int t = 0; t < kTrials; ++t) {
    const Shape s{dim(), dim(1, 7)};
    gradCheck("relu", [](const Inputs& in) { return relu(in[0]); }, {rnd(s)});
    gradCheck("gelu", [](const Inputs& in) { return gelu(in[0]); }, {rnd(s)});
    gradCheck("tanh", [](const Inputs& in) { return tanh(in[0]); }, {rnd(s)});
    gradCheck("sigmoid", [](const Inputs& in) { return sigmoid(in[0]); }, {rnd(s)});
    gradCheck("exp", [](const Inputs& in) { return exp(in[0]); }, {rnd(s)});
    gradCheck("log", [](const Inputs& in) { return log(in[0]); }, {positive(s)});
  }
}

TEST_F(GradCheck, MatmulTransposeLinear) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t m = dim(), k = dim(), n = dim();
    gradCheck("matmul", [](const Inputs& in) { return matmul(in[0], in[1]); },
              {rnd({m, k}), rnd({k, n})});
    gradCheck("transpose", [](const Inputs& in) { return transpose(in[0]); }, {rnd({m, n})});
    gradCheck("linear", [](const Inputs& in) { return linear(in[0], in[1], in[2]); },
              {rnd({m, k}), rnd({n, k}), rnd({n})});
    gradCheck("linear no bias", [](const Inputs& in) { return linear(in[0], in[1]); },
              {rnd({m, k}), rnd({n, k})});
  }
}

TEST_F(GradCheck, Reductions) {
  for (int t = 0; t < kTrials; ++t) {
    const Shape s{dim(), dim(), dim()};
    gradCheck("sum", [](const Inputs& in) { return sum(in[0]); }, {rnd(s)});
    gradCheck("mean", [](const Inputs& in) { return mean(in[0]); }, {rnd(s)});
    for (int64_t d : {0, 1, 2, -1}) {
      for (bool keep : {false, true}) {
        const std::string tag = " dim " + std::to_string(d) + (keep ? " keepdim" : "");
        gradCheck("sum" + tag, [d, keep](const Inputs& in) { return sum(in[0], d, keep); },
                  {rnd(s)});
        gradCheck("mean" + tag, [d, keep](const Inputs& in) { return mean(in[0], d, keep); },
                  {rnd(s)});
      }
    }
  }
}

TEST_F(GradCheck, SoftmaxAndLogSoftmax) {
  for (int t = 0; t < kTrials; ++t) {
    const Shape s{dim(), dim(2, 6), dim()};
    for (int64_t d : {0, 1, -1}) {
      gradCheck("softmax dim " + std::to_string(d),
                [d](const Inputs& in) { return softmax(in[0], d); }, {rnd(s)});
      gradCheck("logSoftmax dim " + std::to_string(d),
                [d](const Inputs& in) { return logSoftmax(in[0], d); }, {rnd(s)});
    }
  }
}

TEST_F(GradCheck, Losses) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t n = dim(), c = dim(2, 6);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int64_t>(gen_.nextU64() % c));
    Tensor y = fromVector(labels);
    gradCheck("crossEntropy", [y](const Inputs& in) { return crossEntropy(in[0], y); },
              {rnd({n, c})});
    gradCheck("mseLoss", [](const Inputs& in) { return mseLoss(in[0], in[1]); },
              {rnd({n, c}), rnd({n, c})});
  }
}

TEST_F(GradCheck, Dropout) {
  for (double p : {0.0, 0.3, 0.7}) {
    // The same seed every call, so the finite differences see the same mask.
    gradCheck("dropout",
              [p](const Inputs& in) {
                Generator g(99);
                return dropout(in[0], p, true, g);
              },
              {rnd({dim(), dim(2, 8)})});
  }
}

TEST_F(GradCheck, BatchNormTrainingAndEval) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t n = dim(2, 6), c = dim();
    gradCheck(
        "batchNorm train",
        [](const Inputs& in) { return batchNorm(in[0], Tensor(), Tensor(), in[1], in[2], true); },
        {rnd({n, c}), rnd({c}), rnd({c})});
    gradCheck("batchNorm train no affine",
              [](const Inputs& in) {
                return batchNorm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
              },
              {rnd({n, c})});
    Tensor rm = rnd({c}), rv = positive({c});
    gradCheck("batchNorm eval",
              [rm, rv](const Inputs& in) { return batchNorm(in[0], rm, rv, in[1], in[2], false); },
              {rnd({n, c}), rnd({c}), rnd({c})});
  }
}

TEST_F(GradCheck, EmbeddingReshapeClone) {
  const int64_t v = dim(2, 6), d = dim();
  Tensor idx = fromVector(std::vector<int64_t>{0, v - 1, 1, 0, v - 1, 1}, {2, 3});
  gradCheck("embedding", [idx](const Inputs& in) { return embedding(in[0], idx); }, {rnd({v, d})});
  gradCheck("reshape", [](const Inputs& in) { return in[0].reshape({-1}) * 2.0; }, {rnd({3, 4})});
  gradCheck("clone", [](const Inputs& in) { return in[0].clone() * in[0]; }, {rnd({3, 4})});
}

TEST_F(GradCheck, ComposedMlp) {
  // A small model end to end: linear -> gelu -> batchnorm -> tanh -> linear -> cross-entropy.
  Tensor y = fromVector(std::vector<int64_t>{0, 2, 1, 2});
  gradCheck("mlp",
            [y](const Inputs& in) {
              Tensor h = gelu(linear(in[0], in[1], in[2]));
              h = tanh(batchNorm(h, Tensor(), Tensor(), Tensor(), Tensor(), true));
              return crossEntropy(linear(h, in[3]), y);
            },
            {rnd({4, 5}), rnd({6, 5}), rnd({6}), rnd({3, 6})});
}

}  // namespace
}  // namespace loom::ag
