// Helpers for autograd_lite tests: fixture loading, closeness checks and a float64
// finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/autograd/autograd.h"

namespace loom::ag::test_util {

inline std::string fixturePath(const std::string& name) {
  // Appended rather than `std::string(DIR) + "/" + name`: GCC 12 inlines that chain into a
  // false -Warray-bounds (its PR 105651) when gtest's headers come precompiled.
  std::string path = LOOM_AG_FIXTURE_DIR;
  path += '/';
  path += name;
  return path;
}

inline nlohmann::json loadJson(const std::string& name) {
  std::ifstream in(fixturePath(name));
  EXPECT_TRUE(in.good()) << "cannot open fixture " << fixturePath(name);
  return nlohmann::json::parse(in);
}

// Max |a - b| over elements, as double.
template <class T>
double maxAbsDiff(const T* a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline double maxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Checks the analytic gradient of sum(f(inputs) * w), for a fixed random w, against central
// finite differences. inputs must be float64; they are made leaves that require grad.
inline void gradCheck(const std::string& what,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      std::vector<Tensor> inputs, uint64_t seed = 1, double eps = 1e-6,
                      double atol = 1e-7, double rtol = 1e-5) {
  for (auto& x : inputs) {
    ASSERT_EQ(x.dtype(), DType::kFloat64) << what;
    x.setRequiresGrad(true);
    x.zeroGrad(true);
  }
  Tensor out = f(inputs);
  Generator gen(seed);
  Tensor w = randn(out.shape(), gen, DType::kFloat64);
  sum(mul(out, w)).backward();
  auto objective = [&]() {
    NoGradGuard ng;
    return sum(mul(f(inputs), w)).item();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor g = inputs[i].grad();
    ASSERT_TRUE(g.defined()) << what << ": input " << i << " got no gradient";
    double* p = inputs[i].data<double>();
    const double* pg = g.data<double>();
    double worst = 0;
    for (int64_t k = 0; k < inputs[i].numel(); ++k) {
      const double saved = p[k];
      p[k] = saved + eps;
      const double up = objective();
      p[k] = saved - eps;
      const double down = objective();
      p[k] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double err = std::abs(numeric - pg[k]);
      worst = std::max(worst, err);
      ASSERT_LE(err, atol + rtol * std::abs(numeric))
          << what << ": input " << i << " " << shapeToString(inputs[i].shape()) << " element " << k
          << ": analytic " << pg[k] << " vs numeric " << numeric;
    }
  }
}

}  // namespace loom::ag::test_util
