// Shared pieces of the DDP tests: small models, deterministic data, a single-process
// reference trainer, and comparisons that print the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/autograd/autograd.h"
#include "loom/autograd/nn.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/optim.h"

namespace loom::ddp::testing {

namespace nn = ag::nn;

// Sequential(Linear, ReLU, Linear, ReLU, ..., Linear) with fixed seeds.
inline std::shared_ptr<nn::Sequential> makeMlp(const std::vector<int64_t>& sizes,
                                               uint64_t seed = 7) {
  auto model = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    nn::LinearOptions lo;
    lo.seed = seed + i;
    model->append(std::make_shared<nn::Linear>(sizes[i], sizes[i + 1], lo));
    if (i + 2 < sizes.size()) model->append(std::make_shared<nn::ReLU>());
  }
  return model;
}

struct Dataset {
  ag::Tensor x;       // [rows, features]
  ag::Tensor labels;  // [rows] int64
};

inline Dataset makeData(int64_t rows, int64_t features, int64_t classes, uint64_t seed = 3) {
  ag::Generator gen(seed);
  Dataset d;
  d.x = ag::randn({rows, features}, gen);
  std::vector<int64_t> labels(rows);
  for (auto& l : labels) l = static_cast<int64_t>(gen.nextU64() % classes);
  d.labels = ag::fromVector(labels);
  return d;
}

// Rows [begin, begin + count) of the data set.
inline ag::Tensor rowsOf(const ag::Tensor& t, int64_t begin, int64_t count) {
  ag::Shape shape = t.shape();
  const int64_t rowElems = t.numel() / shape[0];
  shape[0] = count;
  ag::Tensor out = ag::empty(shape, t.dtype());
  const size_t rowBytes = static_cast<size_t>(rowElems) * ag::dtypeSize(t.dtype());
  std::memcpy(out.rawData(), static_cast<const char*>(t.rawData()) + begin * rowBytes,
              count * rowBytes);
  return out;
}

enum class OptKind { kSGD, kAdam };

inline std::unique_ptr<ag::optim::Optimizer> makeOptimizer(OptKind kind,
                                                           std::vector<ag::Tensor> params) {
  if (kind == OptKind::kSGD) {
    ag::optim::SGDOptions o;
    o.momentum = 0.9;
    return std::make_unique<ag::optim::SGD>(std::move(params), 0.05, o);
  }
  return std::make_unique<ag::optim::Adam>(std::move(params), 0.01);
}

// Max |a - b| over max |b| (the largest value), per tensor by name; fails on the worst.
inline void expectClose(const nn::NamedTensors& actual, const nn::NamedTensors& expected,
                        double relTol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const auto& a = actual[i].second;
    const auto& b = expected[i].second;
    ASSERT_EQ(a.numel(), b.numel()) << what << " " << actual[i].first;
    if (a.dtype() != ag::DType::kFloat32) continue;
    const float* ad = a.data<float>();
    const float* bd = b.data<float>();
    double maxDiff = 0, maxRef = 0;
    int64_t worst = 0;
    for (int64_t j = 0; j < a.numel(); ++j) {
      const double d = std::fabs(static_cast<double>(ad[j]) - bd[j]);
      if (d > maxDiff) maxDiff = d, worst = j;
      maxRef = std::max(maxRef, std::fabs(static_cast<double>(bd[j])));
    }
    EXPECT_LE(maxDiff, relTol * std::max(maxRef, 1e-3))
        << what << ": " << actual[i].first << "[" << worst << "] = " << ad[worst]
        << " vs reference " << bd[worst] << " (max |ref| " << maxRef << ")";
  }
}

}  // namespace loom::ddp::testing
