// Optimizers and LR schedules against PyTorch (fixtures/optim_reference.json).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom::ag
