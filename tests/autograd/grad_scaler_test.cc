// GradScaler against PyTorch's documented state machine: the scale/growth-tracker sequences
// come from fixtures/make_grad_scaler_reference.py (a plain-Python re-implementation of
// torch.cuda.amp.GradScaler.update and the _amp_update_scale_ kernel, since PyTorch 1.13's CPU
// build has no amp kernels), replayed here through real unscale/step/update calls; the
// per-optimizer rules (skip on inf/NaN, once-only unscale/step, errors) are asserted directly.
#include "loom/autograd/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace loom::ag::optim {
namespace {

// One parameter p (float32, [2]) whose gradient the test sets directly.
struct OneParam {
  Tensor p = fromVector(std::vector<float>{1.0f, 2.0f}).setRequiresGrad(true);
  void setGrad(float a, float b) { p.setGrad(fromVector(std::vector<float>{a, b})); }
};

TEST(GradScaler, ReplaysTheReferenceSequences) {
  const auto ref = test_util::loadJson("grad_scaler_reference.json");
  ASSERT_EQ(ref["scenarios"].size(), 4u);
  for (const auto& sc : ref["scenarios"]) {
    const auto& c = sc["config"];
    GradScalerOptions o;
    o.initScale = c["init_scale"].get<double>();
    o.growthFactor = c["growth_factor"].get<double>();
    o.backoffFactor = c["backoff_factor"].get<double>();
    o.growthInterval = c["growth_interval"].get<int64_t>();
    GradScaler scaler(o);
    OneParam m;
    SGD opt({m.p}, 0.0);  // lr 0: the parameter never moves, only the scaler's state matters
    size_t i = 0;
    for (const auto& s : sc["steps"]) {
      const bool inf = s["found_inf"].get<bool>();
      m.setGrad(inf ? std::numeric_limits<float>::infinity() : 1.0f, 0.5f);
      EXPECT_EQ(scaler.step(opt), !inf) << "step " << i;
      scaler.update();
      ASSERT_EQ(scaler.scaleValue(), s["scale"].get<double>())
          << "growth_interval " << o.growthInterval << ", step " << i;
      ASSERT_EQ(scaler.growthTracker(), s["growth_tracker"].get<int64_t>()) << "step " << i;
      ++i;
    }
  }
}

TEST(GradScaler, DefaultsAreTorchs) {
  GradScaler s;
  EXPECT_EQ(s.scaleValue(), 65536.0);
  EXPECT_EQ(s.options().growthFactor, 2.0);
  EXPECT_EQ(s.options().backoffFactor, 0.5);
  EXPECT_EQ(s.options().growthInterval, 2000);
}

TEST(GradScaler, KnownSequence) {
  GradScaler s({.initScale = 8.0, .growthInterval = 2});
  OneParam m;
  SGD opt({m.p}, 0.0);
  const bool infs[] = {false, false, true, false, false, false};
  const double scales[] = {8, 16, 8, 8, 16, 16};
  const int64_t trackers[] = {1, 0, 0, 1, 0, 1};
  for (int i = 0; i < 6; ++i) {
    m.setGrad(infs[i] ? NAN : 1.0f, 1.0f);
    s.step(opt);
    s.update();
    EXPECT_EQ(s.scaleValue(), scales[i]) << i;
    EXPECT_EQ(s.growthTracker(), trackers[i]) << i;
  }
}

TEST(GradScaler, ScaleAndUnscale) {
  GradScaler s({.initScale = 1024.0});
  Tensor loss = scalarTensor(3.0).setRequiresGrad(true);
  Tensor scaled = s.scale(loss);
  EXPECT_EQ(scaled.item(), 3072.0);
  scaled.backward();
  EXPECT_EQ(loss.grad().item(), 1024.0);  // the gradient carries the scale

  OneParam m;
  m.setGrad(2048.0f, -512.0f);
  SGD opt({m.p}, 0.5);
  s.unscale(opt);
  EXPECT_EQ(m.p.grad().toVector<float>(), (std::vector<float>{2.0f, -0.5f}));
  EXPECT_TRUE(s.step(opt));  // uses the unscaled gradient, does not unscale again
  EXPECT_EQ(m.p.toVector<float>(), (std::vector<float>{0.0f, 2.25f}));
}

TEST(GradScaler, SkipsTheStepOnInfOrNan) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler s;
    OneParam m;
    Adam opt({m.p}, 0.1);
    m.setGrad(1.0f, bad);
    EXPECT_FALSE(s.step(opt));
    EXPECT_EQ(m.p.toVector<float>(), (std::vector<float>{1.0f, 2.0f}));
    EXPECT_TRUE(opt.stateDict().size() > 0);
    for (const auto& [name, t] : opt.stateDict()) {
      EXPECT_EQ(name.rfind("state.", 0), std::string::npos) << "Adam state created: " << name;
    }
    s.update();
    EXPECT_EQ(s.scaleValue(), 32768.0);
    m.setGrad(1.0f, 1.0f);
    EXPECT_TRUE(s.step(opt));
    EXPECT_NE(m.p.toVector<float>(), (std::vector<float>{1.0f, 2.0f}));
  }
}

TEST(GradScaler, PerOptimizerSkipAndCombinedUpdate) {
  GradScaler s;
  OneParam a, b;
  SGD optA({a.p}, 1.0), optB({b.p}, 1.0);
  a.setGrad(65536.0f, 0.0f);
  b.setGrad(std::numeric_limits<float>::infinity(), 0.0f);
  EXPECT_TRUE(s.step(optA));
  EXPECT_FALSE(s.step(optB));
  EXPECT_EQ(a.p.toVector<float>(), (std::vector<float>{0.0f, 2.0f}));
  EXPECT_EQ(b.p.toVector<float>(), (std::vector<float>{1.0f, 2.0f}));
  s.update();
  EXPECT_EQ(s.scaleValue(), 32768.0);  // any optimizer's inf backs off
  EXPECT_EQ(s.growthTracker(), 0);
}

TEST(GradScaler, MisuseThrowsLikeTorch) {
  GradScaler s;
  OneParam m;
  m.setGrad(1.0f, 1.0f);
  SGD opt({m.p}, 0.0);
  EXPECT_THROW(s.update(), std::logic_error);  // no inf checks recorded
  s.unscale(opt);
  EXPECT_THROW(s.unscale(opt), std::logic_error);
  s.step(opt);
  EXPECT_THROW(s.step(opt), std::logic_error);
  EXPECT_THROW(s.unscale(opt), std::logic_error);
  s.update();
  EXPECT_NO_THROW(s.unscale(opt));  // update() clears the per-optimizer stages
  EXPECT_THROW(GradScaler({.growthFactor = 1.0}), std::invalid_argument);
  EXPECT_THROW(GradScaler({.backoffFactor = 1.0}), std::invalid_argument);
  EXPECT_THROW(GradScaler({.growthInterval = 0}), std::invalid_argument);
  EXPECT_THROW(s.update(-1.0), std::invalid_argument);
}

TEST(GradScaler, UpdateWithNewScale) {
  GradScaler s;
  OneParam m;
  SGD opt({m.p}, 0.0);
  m.setGrad(1.0f, 1.0f);
  s.step(opt);
  s.update(100.0);
  EXPECT_EQ(s.scaleValue(), 100.0);
  EXPECT_EQ(s.growthTracker(), 0);
  EXPECT_NO_THROW(s.step(opt));
}

TEST(GradScaler, Disabled) {
  GradScaler s({.enabled = false});
  Tensor loss = scalarTensor(3.0);
  EXPECT_TRUE(s.scale(loss).is(loss));
  OneParam m;
  m.setGrad(std::numeric_limits<float>::infinity(), 1.0f);
  SGD opt({m.p}, 1.0);
  EXPECT_TRUE(s.step(opt));  // no inf check when disabled
  EXPECT_TRUE(std::isinf(m.p.toVector<float>()[0]));
  EXPECT_NO_THROW(s.update());
  EXPECT_EQ(s.scaleValue(), 1.0);
  EXPECT_TRUE(s.stateDict().empty());
  GradScaler enabled;
  EXPECT_THROW(enabled.loadStateDict(s.stateDict()), std::invalid_argument);
  EXPECT_THROW(s.loadStateDict(enabled.stateDict()), std::logic_error);
}

TEST(GradScaler, StateDictRoundTrip) {
  GradScaler a(
      {.initScale = 512.0, .growthFactor = 3.0, .backoffFactor = 0.25, .growthInterval = 7});
  OneParam m;
  SGD opt({m.p}, 0.0);
  for (int i = 0; i < 3; ++i) {
    m.setGrad(1.0f, 1.0f);
    a.step(opt);
    a.update();
  }
  const nn::NamedTensors sd = a.stateDict();
  ASSERT_EQ(sd.size(), 5u);
  EXPECT_EQ(sd[0].first, "scale");
  EXPECT_EQ(sd[4].first, "_growth_tracker");
  GradScaler b;
  b.loadStateDict(sd);
  EXPECT_EQ(b.scaleValue(), 512.0);
  EXPECT_EQ(b.growthTracker(), 3);
  EXPECT_EQ(b.options().growthFactor, 3.0);
  EXPECT_EQ(b.options().backoffFactor, 0.25);
  EXPECT_EQ(b.options().growthInterval, 7);
  // Same future: four more clean steps reach the interval in both.
  for (GradScaler* s : {&a, &b}) {
    for (int i = 0; i < 4; ++i) {
      m.setGrad(1.0f, 1.0f);
      s->step(opt);
      s->update();
    }
  }
  EXPECT_EQ(a.scaleValue(), 1536.0);
  EXPECT_EQ(b.scaleValue(), a.scaleValue());

  nn::NamedTensors missing(sd.begin(), sd.end() - 1);
  GradScaler c;
  EXPECT_THROW(c.loadStateDict(missing), std::invalid_argument);
  EXPECT_EQ(c.scaleValue(), 65536.0);  // unchanged after a rejected load
  nn::NamedTensors badType = sd;
  badType[0].second = scalarTensor(1.0, DType::kFloat32);
  EXPECT_THROW(c.loadStateDict(badType), std::invalid_argument);
  nn::NamedTensors extra = sd;
  extra.emplace_back("foo", scalarTensor(1.0, DType::kFloat64));
  EXPECT_THROW(c.loadStateDict(extra), std::invalid_argument);
}

TEST(GradScaler, RejectsLowPrecisionGradients) {
  GradScaler s;
  Tensor p = zeros({2}, DType::kBFloat16).setRequiresGrad(true);
  p.setGrad(zeros({2}, DType::kBFloat16));
  SGD opt({p}, 0.1);
  try {
    s.unscale(opt);
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16 gradient"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::ag::optim
