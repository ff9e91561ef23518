// DistributedSampler against torch.utils.data.DistributedSampler's split (fixtures generated
// by fixtures/make_sampler_reference.py), and the shuffled and sequential variants.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/common/error.h"
#include "loom/ddp/sampler.h"

namespace loom::ddp {
namespace {

TEST(DistributedSampler, MatchesPyTorchWithoutShuffle) {
  std::ifstream in(std::string(LOOM_DDP_FIXTURES) + "/sampler_reference.json");
  ASSERT_TRUE(in) << "missing fixture";
  const auto ref = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : ref["cases"]) {
    DistributedSampler s(c["size"].get<int64_t>(), c["replicas"].get<int>(), c["rank"].get<int>(),
                         false, 0, c["drop_last"].get<bool>());
    const auto expected = c["indices"].get<std::vector<int64_t>>();
    EXPECT_EQ(s.indices(), expected) << c.dump();
    EXPECT_EQ(s.numSamples(), static_cast<int64_t>(expected.size())) << c.dump();
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(DistributedSampler, ShuffleIsAPermutationSharedByRanksAndChangesPerEpoch) {
  const int64_t size = 23;
  const int replicas = 4;
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t epoch : {0, 1}) {
    std::multiset<int64_t> seen;
    std::vector<int64_t> joined;
    for (int r = 0; r < replicas; ++r) {
      DistributedSampler s(size, replicas, r, true, 42);
      s.setEpoch(epoch);
      const auto idx = s.indices();
      EXPECT_EQ(idx.size(), 6u);
      seen.insert(idx.begin(), idx.end());
      joined.insert(joined.end(), idx.begin(), idx.end());
      DistributedSampler again(size, replicas, r, true, 42);
      again.setEpoch(epoch);
      EXPECT_EQ(again.indices(), idx);
    }
    for (int64_t i = 0; i < size; ++i) EXPECT_GE(seen.count(i), 1u) << i;
    EXPECT_EQ(seen.size(), 24u);  // one index repeated as padding
    epochs.push_back(joined);
  }
  EXPECT_NE(epochs[0], epochs[1]);
}

TEST(DistributedSampler, BadArgumentsAreNamed) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), InvalidArgumentError);
  try {
    DistributedSampler(10, 2, 2);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank must be in [0, 2), got 2"));
  }
}

TEST(SequentialDistributedSampler, ContiguousBlocksPaddedAtTheEnd) {
  EXPECT_EQ(SequentialDistributedSampler(10, 3, 0).indices(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(SequentialDistributedSampler(10, 3, 2).indices(), (std::vector<int64_t>{8, 9, 9, 9}));
  EXPECT_TRUE(SequentialDistributedSampler(0, 2, 1).indices().empty());
}

}  // namespace
}  // namespace loom::ddp
