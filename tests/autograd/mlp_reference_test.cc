// The MLP 784-1024-1024-10 (ReLU, cross-entropy, batch 64) against PyTorch: forward values,
// gradients, and one SGD / AdamW step. fixtures/make_mlp_reference.py made the numbers; the
// weights and data come from the same integer-hash formula on both sides (see the script).
//
// Tolerance: 1e-5 relative. For a whole tensor or a sample of it that means
// max|ours - torch| <= 1e-5 * max|torch| over the compared elements; for a sum of signed values
// it is relative to the sum of magnitudes (a signed sum can cancel to ~0, e.g. the last layer's
// weight gradient sums to zero exactly in exact arithmetic).
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace loom::ag {
namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kSizes[] = {784, 1024, 1024, 10};
constexpr double kRel = 1e-5;

uint64_t hashed(uint64_t tensorId, uint64_t i) {
  return (i * 2654435761ULL + (tensorId * 40503 + 12345)) & 0xFFFFFFFFULL;
}

Tensor paramValues(uint64_t id, const Shape& shape, int64_t fanIn) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  const double bound = 2.5 / std::sqrt(static_cast<double>(fanIn));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t centered = static_cast<int64_t>(hashed(id, i) % 2001) - 1000;
    p[i] = static_cast<float>((static_cast<double>(centered) / 1000.0) * bound);
  }
  return t;
}

std::shared_ptr<nn::Sequential> buildMlp() {
  auto model = std::make_shared<nn::Sequential>();
  for (int l = 0; l < 3; ++l) {
    auto lin = std::make_shared<nn::Linear>(kSizes[l], kSizes[l + 1]);
    lin->weight().copyFrom(paramValues(2 * l, {kSizes[l + 1], kSizes[l]}, kSizes[l]));
    lin->bias().copyFrom(paramValues(2 * l + 1, {kSizes[l + 1]}, kSizes[l]));
    model->append(lin);
    if (l < 2) model->append(std::make_shared<nn::ReLU>());
  }
  return model;
}

Tensor input() {
  Tensor x = empty({kBatch, 784});
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    p[i] = static_cast<float>(static_cast<double>(hashed(100, i) % 1000) / 1000.0);
  }
  return x;
}

Tensor labels() {
  std::vector<int64_t> y(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) y[i] = static_cast<int64_t>(hashed(101, i) % 10);
  return fromVector(y);
}

// Compares `values` (as double) with the reference list; returns the scaled error.
double scaledError(const std::vector<double>& ours, const std::vector<double>& ref) {
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(ours[i] - ref[i]));
  return err / std::max(test_util::maxAbs(ref), 1e-30);
}

std::vector<double> sampleOf(const Tensor& t, int count = 256) {
  std::vector<double> out;
  const float* p = t.data<float>();
  for (int j = 0; j < count; ++j)
    out.push_back(p[(static_cast<int64_t>(j) * 7919 + 13) % t.numel()]);
  return out;
}

struct Sums {
  double sum = 0, absSum = 0, sqSum = 0;
};

Sums sums(const float* p, int64_t n) {
  Sums s;
  for (int64_t i = 0; i < n; ++i) {
    s.sum += p[i];
    s.absSum += std::abs(static_cast<double>(p[i]));
    s.sqSum += static_cast<double>(p[i]) * p[i];
  }
  return s;
}

void expectSummary(const std::string& what, const Tensor& t, const nlohmann::json& ref) {
  const Sums s = sums(t.data<float>(), t.numel());
  const double absSum = ref["abs_sum"].get<double>();
  EXPECT_LE(std::abs(s.sum - ref["sum"].get<double>()), kRel * absSum) << what << " sum";
  EXPECT_LE(std::abs(s.absSum - absSum), kRel * absSum) << what << " abs_sum";
  EXPECT_LE(std::abs(s.sqSum - ref["sq_sum"].get<double>()), kRel * ref["sq_sum"].get<double>())
      << what << " sq_sum";
  const double err = scaledError(sampleOf(t), ref["samples"].get<std::vector<double>>());
  EXPECT_LE(err, kRel) << what << " samples, scaled max diff " << err;
}

class MlpReference : public ::testing::Test {
 protected:
  void SetUp() override {
    ref_ = test_util::loadJson("mlp_reference.json");
    model_ = buildMlp();
    Tensor logits = (*model_)(input());
    logits_ = logits.detach();
    loss_ = crossEntropy(logits, labels());
    loss_.backward();
  }
  nlohmann::json ref_;
  std::shared_ptr<nn::Sequential> model_;
  Tensor logits_, loss_;
};

TEST_F(MlpReference, ForwardMatchesPyTorch) {
  const double want = ref_["loss"].get<double>();
  EXPECT_LE(std::abs(loss_.item() - want), kRel * want) << loss_.item() << " vs " << want;
  const auto ours = logits_.toVector<float>();
  const double err = scaledError(std::vector<double>(ours.begin(), ours.end()),
                                 ref_["logits"].get<std::vector<double>>());
  EXPECT_LE(err, kRel) << "logits scaled max diff " << err;
}

TEST_F(MlpReference, GradientsMatchPyTorch) {
  for (auto& [name, p] : model_->namedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    expectSummary(name + " grad", p.grad(), ref_["grads"][name]);
  }
  for (const char* name : {"4.weight", "4.bias"}) {
    Tensor g;
    for (auto& [n, p] : model_->namedParameters()) {
      if (n == name) g = p.grad();
    }
    const auto ours = g.toVector<float>();
    const double err = scaledError(std::vector<double>(ours.begin(), ours.end()),
                                   ref_["last_layer_grads"][name].get<std::vector<double>>());
    EXPECT_LE(err, kRel) << name << " full gradient, scaled max diff " << err;
  }
}

void expectStep(const std::string& tag, nn::Module& model,
                const std::vector<std::vector<float>>& before, const nlohmann::json& ref) {
  size_t i = 0;
  for (auto& [name, p] : model.namedParameters()) {
    const auto& r = ref["params"][name];
    expectSummary(tag + " " + name, p, r);
    // The update itself (new - old), which is far smaller than the parameter.
    const float* now = p.data<float>();
    const auto& old = before[i++];
    double dsum = 0, dabs = 0;
    for (size_t k = 0; k < old.size(); ++k) {
      const double d = static_cast<double>(now[k]) - old[k];
      dsum += d;
      dabs += std::abs(d);
    }
    // new and old are float32, so the update carries their rounding (about 2^-24 |p|); the
    // sums of updates are compared at 1e-4 relative to the sum of |update|.
    const double refAbs = r["delta_abs_sum"].get<double>();
    EXPECT_LE(std::abs(dabs - refAbs), 1e-4 * refAbs) << tag << " " << name << " |update| sum";
    EXPECT_LE(std::abs(dsum - r["delta_sum"].get<double>()), 1e-4 * refAbs)
        << tag << " " << name << " update sum";
  }
}

std::vector<std::vector<float>> snapshot(nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (auto& p : model.parameters()) out.push_back(p.toVector<float>());
  return out;
}

TEST_F(MlpReference, SgdStepMatchesPyTorch) {
  const auto& r = ref_["sgd"];
  auto before = snapshot(*model_);
  optim::SGD sgd(model_->parameters(), r["lr"].get<double>(),
                 {.momentum = r["momentum"].get<double>(),
                  .weightDecay = r["weight_decay"].get<double>(),
                  .nesterov = r["nesterov"].get<bool>()});
  sgd.step();
  expectStep("sgd", *model_, before, r);
}

TEST_F(MlpReference, AdamWStepMatchesPyTorch) {
  const auto& r = ref_["adamw"];
  auto before = snapshot(*model_);
  optim::AdamW adamw(model_->parameters(), r["lr"].get<double>(),
                     {.weightDecay = r["weight_decay"].get<double>()});
  adamw.step();
  expectStep("adamw", *model_, before, r);
}

}  // namespace
}  // namespace loom::ag
