// The parameter-server example trains to the same parameters as one process (synchronous
// rounds, gradients summed in trainer order: equal bit for bit in practice; allowed 1e-6), and
// the loss goes down.
#include "parameter_server.h"

#include <gtest/gtest.h>

#include <cmath>

#include "loom/testing/ranks.h"

namespace loom::examples {
namespace {

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

TEST(ParameterServerTest, DistributedTrainingEqualsOneProcess) {
  testing::TempDir dir;
  PsConfig c;
  c.trainers = 3;
  c.rounds = 30;
  c.timeout = std::chrono::milliseconds(60000);
  const PsResult dist = trainDistributed(c, dir.path());
  const PsResult one = trainOneProcess(c);
  EXPECT_LE(maxAbsDiff(dist.params.embedding, one.params.embedding), 1e-6);
  EXPECT_LE(maxAbsDiff(dist.params.weight, one.params.weight), 1e-6);
  EXPECT_LE(maxAbsDiff(dist.params.bias, one.params.bias), 1e-6);
  ASSERT_EQ(dist.losses.size(), one.losses.size());
  for (size_t r = 0; r < one.losses.size(); ++r) {
    EXPECT_NEAR(dist.losses[r], one.losses[r], 1e-9) << "round " << r;
  }
  // It learns: the mean loss of the last 5 rounds is well below that of the first 5.
  ASSERT_EQ(one.losses.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += one.losses[static_cast<size_t>(i)] / 5;
    last += one.losses[one.losses.size() - 1 - static_cast<size_t>(i)] / 5;
  }
  EXPECT_LT(last, 0.8 * first) << "first 5 rounds " << first << ", last 5 rounds " << last;
  // Touched embedding rows moved away from their initial values (the sparse path did work).
  PsConfig none = c;
  none.rounds = 0;
  EXPECT_GT(maxAbsDiff(trainOneProcess(none).params.embedding, dist.params.embedding), 1e-3);
}

}  // namespace
}  // namespace loom::examples
