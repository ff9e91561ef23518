// Optimizers and LR schedules against PyTorch (fixtures/optim_reference.json), and optimizer
// state dicts: save after k steps, load into a fresh optimizer, continue; bitwise equal to an
// uninterrupted run, with lazily created state (a parameter without gradients at first), and
// clear errors for state that does not fit.
#include <gtest/gtest.h>

#include <cstring>

#include "loom/autograd/serialize.h"
#include "loom/testing/ranks.h"
#include "test_util.h"

namespace loom::ag {
namespace {

using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

void expectTrajectory(const std::string& name, const Factory& make) {
  const auto ref = test_util::loadJson("optim_reference.json");
  Tensor p = fromVector(ref["p0"].get<std::vector<double>>()).setRequiresGrad();
  auto opt = make({p});
  const auto grads = ref["grads"].get<std::vector<std::vector<double>>>();
  const auto want = ref[name].get<std::vector<std::vector<double>>>();
  for (size_t s = 0; s < grads.size(); ++s) {
    p.setGrad(fromVector(grads[s]));
    opt->step();
    const double err = test_util::maxAbsDiff(p.data<double>(), want[s]);
    EXPECT_LE(err, 1e-12) << name << " step " << s + 1;
  }
}

TEST(Optim, SgdMomentumDampeningWeightDecay) {
  expectTrajectory("sgd_momentum", [](std::vector<Tensor> ps) {
    return std::make_unique<optim::SGD>(
        ps, 0.1, optim::SGDOptions{.momentum = 0.9, .dampening = 0.1, .weightDecay = 0.01});
  });
}

TEST(Optim, SgdNesterov) {
  expectTrajectory("sgd_nesterov", [](std::vector<Tensor> ps) {
    return std::make_unique<optim::SGD>(ps, 0.1,
                                        optim::SGDOptions{.momentum = 0.9, .nesterov = true});
  });
}

TEST(Optim, Adam) {
  expectTrajectory("adam", [](std::vector<Tensor> ps) {
    return std::make_unique<optim::Adam>(
        ps, 0.01, optim::AdamOptions{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weightDecay = 0.1});
  });
}

TEST(Optim, AdamW) {
  expectTrajectory("adamw", [](std::vector<Tensor> ps) {
    return std::make_unique<optim::AdamW>(
        ps, 0.01,
        optim::AdamOptions{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weightDecay = 0.05});
  });
}

TEST(Optim, SkipsParametersWithoutGradAndValidates) {
  Tensor a = ones({2}).setRequiresGrad(), b = ones({2}).setRequiresGrad();
  optim::SGD sgd({a, b}, 0.5);
  a.setGrad(ones({2}));
  sgd.step();
  EXPECT_EQ(a.toVector<float>(), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(b.toVector<float>(), (std::vector<float>{1.0f, 1.0f}));
  EXPECT_THROW(optim::SGD({ones({2})}, 0.1), std::invalid_argument);
  EXPECT_THROW(optim::SGD({a}, 0.1, {.nesterov = true}), std::invalid_argument);
  EXPECT_THROW(optim::Adam({a}, 0.1, {.beta1 = 1.0}), std::invalid_argument);
}

TEST(Optim, Schedulers) {
  const auto ref = test_util::loadJson("optim_reference.json");
  Tensor p = zeros({1}).setRequiresGrad();
  {
    optim::SGD opt({p}, 0.5);
    optim::StepLR sched(opt, 3, 0.5);
    for (double want : ref["step_lr"].get<std::vector<double>>()) {
      sched.step();
      EXPECT_NEAR(opt.lr(), want, 1e-15) << "epoch " << sched.epoch();
    }
  }
  {
    optim::SGD opt({p}, 0.5);
    optim::CosineAnnealingLR sched(opt, 5, 0.01);
    for (double want : ref["cosine_lr"].get<std::vector<double>>()) {
      sched.step();
      EXPECT_NEAR(opt.lr(), want, 1e-12) << "epoch " << sched.epoch();
    }
  }
}

// Three parameters of mixed dtypes; parameter 2 gets no gradient before step 3, so its state is
// not created yet when the state is saved after 2 steps.
std::vector<Tensor> makeParams() {
  Generator gen(7);
  return {randn({3, 2}, gen).setRequiresGrad(), randn({4}, gen, DType::kFloat64).setRequiresGrad(),
          randn({2}, gen).setRequiresGrad()};
}

void setGrads(std::vector<Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 2 && step < 3) {
      ps[i].zeroGrad(true);
      continue;
    }
    Generator gen(100 * step + i);
    ps[i].setGrad(randn(ps[i].shape(), gen, ps[i].dtype()));
  }
}

bool bitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.rawData(), b.rawData(), a.nbytes()) == 0;
}

using OptFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Steps 1..total straight, and 1..k then save, load into a fresh optimizer over copies of the
// parameters (through a safetensors file when viaFile), then k+1..total.
void expectExactResume(const OptFactory& make, int k, int total, bool viaFile) {
  auto straight = makeParams();
  auto a = make(straight);
  for (int s = 1; s <= total; ++s) {
    setGrads(straight, s);
    a->step();
    if (s == 2) a->setLr(a->lr() * 0.5);  // a scheduler's change travels with the state
  }
  auto first = makeParams();
  auto b = make(first);
  for (int s = 1; s <= k; ++s) {
    setGrads(first, s);
    b->step();
    if (s == 2) b->setLr(b->lr() * 0.5);
  }
  nn::NamedTensors state = b->stateDict();
  loom::testing::TempDir dir;
  if (viaFile) {
    saveSafetensors(dir.file("optim.safetensors"), state);
    state = loadSafetensors(dir.file("optim.safetensors"));
  }
  std::vector<Tensor> resumed;
  for (auto& p : first) resumed.push_back(p.detach().clone().setRequiresGrad());
  auto c = make(resumed);
  c->setLr(123.0);  // overwritten by the state
  c->loadStateDict(state);
  for (int s = k + 1; s <= total; ++s) {
    setGrads(resumed, s);
    c->step();
    if (s == 2) c->setLr(c->lr() * 0.5);
  }
  for (size_t i = 0; i < straight.size(); ++i) {
    EXPECT_TRUE(bitwiseEqual(straight[i], resumed[i])) << "parameter " << i << " k " << k;
  }
  EXPECT_EQ(a->lr(), c->lr());
  // The state dicts agree too, bit for bit.
  const auto sa = a->stateDict(), sc = c->stateDict();
  ASSERT_EQ(sa.size(), sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sc[i].first);
    EXPECT_TRUE(bitwiseEqual(sa[i].second, sc[i].second)) << sa[i].first;
  }
}

const std::vector<std::pair<std::string, OptFactory>>& optimizers() {
  static const std::vector<std::pair<std::string, OptFactory>> all = {
      {"sgd_momentum",
       [](std::vector<Tensor> ps) {
         return std::make_unique<optim::SGD>(
             ps, 0.1, optim::SGDOptions{.momentum = 0.9, .dampening = 0.1, .weightDecay = 0.01});
       }},
      {"sgd_nesterov",
       [](std::vector<Tensor> ps) {
         return std::make_unique<optim::SGD>(
             ps, 0.1, optim::SGDOptions{.momentum = 0.9, .weightDecay = 0.01, .nesterov = true});
       }},
      {"adam",
       [](std::vector<Tensor> ps) {
         return std::make_unique<optim::Adam>(
             ps, 0.01, optim::AdamOptions{.beta1 = 0.8, .beta2 = 0.99, .weightDecay = 0.1});
       }},
      {"adamw", [](std::vector<Tensor> ps) { return std::make_unique<optim::AdamW>(ps, 0.01); }}};
  return all;
}

TEST(OptimState, ResumeIsBitwiseExact) {
  for (const auto& [name, make] : optimizers()) {
    SCOPED_TRACE(name);
    for (int k : {0, 2, 4}) expectExactResume(make, k, 6, false);
    expectExactResume(make, 2, 6, true);
  }
}

TEST(OptimState, NamesAndLazyState) {
  auto ps = makeParams();
  optim::SGD sgd(ps, 0.1, {.momentum = 0.9});
  auto names = [](const nn::NamedTensors& s) {
    std::vector<std::string> out;
    for (const auto& [n, t] : s) out.push_back(n);
    return out;
  };
  EXPECT_EQ(names(sgd.stateDict()),
            (std::vector<std::string>{"param_groups.0.num_params", "param_groups.0.lr",
                                      "param_groups.0.momentum", "param_groups.0.dampening",
                                      "param_groups.0.weight_decay", "param_groups.0.nesterov"}));
  setGrads(ps, 1);
  sgd.step();
  const auto s = sgd.stateDict();
  EXPECT_EQ(s[0].first, "state.0.momentum_buffer");
  EXPECT_EQ(s[1].first, "state.1.momentum_buffer");
  EXPECT_EQ(s[2].first, "param_groups.0.num_params");  // parameter 2 had no gradient yet
  optim::Adam adam(ps, 0.1);
  setGrads(ps, 3);
  adam.step();
  const auto sa = adam.stateDict();
  EXPECT_EQ(sa[0].first, "state.0.step");
  EXPECT_EQ(sa[0].second.dtype(), DType::kInt64);
  EXPECT_EQ(sa[0].second.dim(), 0);
  EXPECT_EQ(sa[1].first, "state.0.exp_avg");
  EXPECT_EQ(sa[2].first, "state.0.exp_avg_sq");
  EXPECT_EQ(sa[8].first, "state.2.exp_avg_sq");
}

// Expects loadStateDict to throw std::invalid_argument whose message contains `want`, and to
// leave the optimizer's state as it was.
void expectLoadError(optim::Optimizer& opt, const nn::NamedTensors& state,
                     const std::string& want) {
  const auto before = opt.stateDict();
  try {
    opt.loadStateDict(state);
    ADD_FAILURE() << "no error, expected one containing: " << want;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  const auto after = opt.stateDict();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(bitwiseEqual(before[i].second, after[i].second)) << before[i].first;
  }
}

Tensor int64Scalar(int64_t v) {
  Tensor t = zeros({}, DType::kInt64);
  t.data<int64_t>()[0] = v;
  return t;
}

nn::NamedTensors without(nn::NamedTensors s, const std::string& name) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].first == name) {
      s.erase(s.begin() + static_cast<std::ptrdiff_t>(i));
      return s;
    }
  }
  ADD_FAILURE() << "no entry " << name;
  return s;
}

nn::NamedTensors replaced(nn::NamedTensors s, const std::string& name, const Tensor& t) {
  for (auto& [n, v] : s) {
    if (n == name) v = t;
  }
  return s;
}

TEST(OptimState, ErrorsNameTheEntry) {
  auto ps = makeParams();
  optim::SGD sgd(ps, 0.1, {.momentum = 0.9});
  setGrads(ps, 1);
  sgd.step();
  const auto good = sgd.stateDict();
  optim::SGD target(ps, 0.1, {.momentum = 0.9});
  expectLoadError(target, without(good, "param_groups.0.lr"),
                  "SGD.loadStateDict: missing entry 'param_groups.0.lr'");
  auto extra = good;
  extra.emplace_back("state.3.momentum_buffer", zeros({2}));
  extra.emplace_back("state.0.exp_avg", zeros({3, 2}));
  expectLoadError(target, extra,
                  "unexpected entries 'state.0.exp_avg', 'state.3.momentum_buffer' (this "
                  "optimizer has 3 parameters");
  expectLoadError(target, replaced(good, "state.1.momentum_buffer", zeros({5}, DType::kFloat64)),
                  "entry 'state.1.momentum_buffer' is float64 [5], expected float64 [4] (the "
                  "parameter's)");
  expectLoadError(target, replaced(good, "state.0.momentum_buffer", zeros({3, 2}, DType::kFloat64)),
                  "entry 'state.0.momentum_buffer' is float64 [3, 2], expected float32 [3, 2]");
  expectLoadError(target, replaced(good, "param_groups.0.lr", zeros({1}, DType::kFloat64)),
                  "entry 'param_groups.0.lr' is float64 [1], expected a float64 scalar");
  auto twice = good;
  twice.push_back(good[0]);
  expectLoadError(target, twice, "entry 'state.0.momentum_buffer' appears twice");
  optim::SGD fewer({ps[0], ps[1]}, 0.1, {.momentum = 0.9});
  expectLoadError(fewer, good, "the state dict is for 3 parameters");
  expectLoadError(target,
                  replaced(good, "param_groups.0.momentum", scalarTensor(-1.0, DType::kFloat64)),
                  "bad hyper-parameters");
  expectLoadError(target, replaced(good, "param_groups.0.nesterov", int64Scalar(2)),
                  "expected 0 or 1");

  // Adam: SGD's state is not Adam's; partial per-parameter state is named.
  optim::Adam adam(ps, 0.1);
  expectLoadError(adam, good, "Adam.loadStateDict: missing entry 'param_groups.0.beta1'");
  setGrads(ps, 1);
  adam.step();
  const auto agood = adam.stateDict();
  optim::Adam afresh(ps, 0.1);
  expectLoadError(afresh, without(agood, "state.1.exp_avg_sq"),
                  "missing entry 'state.1.exp_avg_sq' (parameter 1 has some Adam state");
  expectLoadError(afresh, replaced(agood, "state.0.step", zeros({}, DType::kInt64)),
                  "entry 'state.0.step' is 0, expected >= 1");
  optim::AdamW adamw(ps, 0.1);
  expectLoadError(adamw, without(agood, "param_groups.0.eps"),
                  "AdamW.loadStateDict: missing entry 'param_groups.0.eps'");
}

}  // namespace
}  // namespace loom::ag
