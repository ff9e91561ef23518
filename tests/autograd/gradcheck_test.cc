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

TEST_F(GradCheck, BatchedMatmulAndLinear) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t b = dim(1, 3), c = dim(1, 3), m = dim(), k = dim(), n = dim();
    gradCheck("matmul batched", [](const Inputs& in) { return matmul(in[0], in[1]); },
              {rnd({b, c, m, k}), rnd({b, c, k, n})});
    gradCheck("matmul shared rhs", [](const Inputs& in) { return matmul(in[0], in[1]); },
              {rnd({b, m, k}), rnd({k, n})});
    gradCheck("matmul shared lhs", [](const Inputs& in) { return matmul(in[0], in[1]); },
              {rnd({m, k}), rnd({b, c, k, n})});
    gradCheck("linear 3-d", [](const Inputs& in) { return linear(in[0], in[1], in[2]); },
              {rnd({b, m, k}), rnd({n, k}), rnd({n})});
  }
}

TEST_F(GradCheck, ShapeOps) {
  for (int t = 0; t < kTrials; ++t) {
    const Shape s{dim(), dim(2, 5), dim()};
    gradCheck("permute", [](const Inputs& in) { return permute(in[0], {2, 0, 1}); }, {rnd(s)});
    gradCheck("permute 4-d",
              [](const Inputs& in) {
                return permute(in[0], {0, 2, 1, 3});
              },
              {rnd({dim(), dim(), dim(), dim()})});
    gradCheck("transpose -1 0", [](const Inputs& in) { return transpose(in[0], -1, 0); }, {rnd(s)});
    gradCheck("slice step 2", [](const Inputs& in) { return slice(in[0], 1, 0, 5, 2); }, {rnd(s)});
    gradCheck("slice negative", [](const Inputs& in) { return slice(in[0], -1, -2, 100); },
              {rnd(s)});
    gradCheck("cat dim 1",
              [](const Inputs& in) {
                return cat({in[0], in[1], in[0]}, 1);
              },
              {rnd({s[0], 2, s[2]}), rnd({s[0], 3, s[2]})});
    gradCheck("split sizes",
              [](const Inputs& in) {
                auto p = split(in[0], {1, 3, 1}, -1);
                return cat({p[2] * 3.0, p[0], p[1] * p[1]}, -1);
              },
              {rnd({dim(), 5})});
    gradCheck("flatten and view",
              [](const Inputs& in) { return view(flatten(in[0], 1), {-1}) * 2.0; }, {rnd(s)});
    gradCheck("causalMask fill 0.5", [](const Inputs& in) { return causalMask(in[0], 0.5); },
              {rnd({2, 3, 4})});
    gradCheck("softmax of causalMask",
              [](const Inputs& in) { return softmax(causalMask(in[0]), -1); }, {rnd({2, 4, 4})});
  }
}

TEST_F(GradCheck, LayerNorm) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t d = dim(2, 7);
    gradCheck("layerNorm", [d](const Inputs& in) { return layerNorm(in[0], {d}, in[1], in[2]); },
              {rnd({dim(), dim(), d}), rnd({d}), rnd({d})});
    gradCheck("layerNorm 2-d shape no affine",
              [d](const Inputs& in) {
                return layerNorm(in[0], {3, d}, Tensor(), Tensor());
              },
              {rnd({dim(), 3, d})});
    gradCheck("layerNorm weight only",
              [d](const Inputs& in) { return layerNorm(in[0], {d}, in[1], Tensor()); },
              {rnd({dim(), d}), rnd({d})});
  }
}

// The attention block as the module composes it, in float64.
TEST_F(GradCheck, CausalSelfAttention) {
  const int64_t b = 2, t = 4, h = 2, d = 3, c = h * d;
  gradCheck("attention",
            [](const Inputs& in) {
              auto qkv = split(linear(in[0], in[1], in[2]), c, -1);
              auto heads = [](const Tensor& z) {
                return permute(z.reshape({b, t, h, d}), {0, 2, 1, 3});
              };
              Tensor att = matmul(heads(qkv[0]), transpose(heads(qkv[1]), -2, -1)) * 0.5;
              att = softmax(causalMask(att), -1);
              Tensor y = permute(matmul(att, heads(qkv[2])), {0, 2, 1, 3}).reshape({b, t, c});
              return linear(y, in[3]);
            },
            {rnd({b, t, c}), rnd({3 * c, c}), rnd({3 * c}), rnd({c, c})});
}

TEST_F(GradCheck, Conv2dAndPooling) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t n = dim(1, 2), c = dim(1, 3), o = dim(1, 3), h = dim(4, 7), w = dim(4, 7);
    for (const Conv2dParams& p :
         {Conv2dParams{}, Conv2dParams{.strideH = 2, .strideW = 1, .padH = 1, .padW = 0},
          Conv2dParams{.strideH = 2, .strideW = 2, .padH = 1, .padW = 2}}) {
      const std::string tag = " stride " + std::to_string(p.strideH) + "x" +
                              std::to_string(p.strideW) + " pad " + std::to_string(p.padH) + "x" +
                              std::to_string(p.padW);
      gradCheck("conv2d" + tag, [p](const Inputs& in) { return conv2d(in[0], in[1], in[2], p); },
                {rnd({n, c, h, w}), rnd({o, c, 3, 2}), rnd({o})});
    }
    gradCheck("conv2d no bias", [](const Inputs& in) { return conv2d(in[0], in[1]); },
              {rnd({n, c, h, w}), rnd({o, c, 1, 1})});
    for (const Pool2dParams& p :
         {Pool2dParams{},
          Pool2dParams{
              .kernelH = 3, .kernelW = 3, .strideH = 2, .strideW = 2, .padH = 1, .padW = 1},
          Pool2dParams{
              .kernelH = 2, .kernelW = 3, .strideH = 1, .strideW = 2, .padH = 1, .padW = 0}}) {
      gradCheck("maxPool2d", [p](const Inputs& in) { return maxPool2d(in[0], p); },
                {rnd({n, c, h, w})});
      gradCheck("avgPool2d", [p](const Inputs& in) { return avgPool2d(in[0], p); },
                {rnd({n, c, h, w})});
    }
  }
}

TEST_F(GradCheck, CrossEntropyIgnoreAndSmoothing) {
  for (int t = 0; t < kTrials; ++t) {
    const int64_t n = dim(2, 6), c = dim(2, 6);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int64_t>(gen_.nextU64() % c));
    labels[0] = -100;
    Tensor y = fromVector(labels);
    for (double eps : {0.0, 0.1, 1.0}) {
      gradCheck("crossEntropy smoothing " + std::to_string(eps),
                [y, eps](const Inputs& in) {
                  return crossEntropy(in[0], y, {.ignoreIndex = -100, .labelSmoothing = eps});
                },
                {rnd({n, c})});
    }
  }
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
