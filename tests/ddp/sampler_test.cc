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

// Shuffled: the same indices as torch's sampler (torch.randperm seeded seed + epoch) for many
// sizes, seeds (one above 2^32) and epochs; for the largest size the fixture keeps the first and
// last 50 indices.
TEST(DistributedSampler, ShuffleMatchesPyTorch) {
  std::ifstream in(std::string(LOOM_DDP_FIXTURES) + "/sampler_reference.json");
  ASSERT_TRUE(in) << "missing fixture";
  const auto ref = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : ref["shuffled"]) {
    DistributedSampler s(c["size"].get<int64_t>(), c["replicas"].get<int>(), c["rank"].get<int>(),
                         true, c["seed"].get<uint64_t>(), c["drop_last"].get<bool>());
    s.setEpoch(c["epoch"].get<int64_t>());
    auto got = s.indices();
    const auto expected = c["indices"].get<std::vector<int64_t>>();
    if (c["size"].get<int64_t>() > 1000) {
      ASSERT_GE(got.size(), 100u);
      got.erase(got.begin() + 50, got.end() - 50);
    }
    EXPECT_EQ(got, expected) << "size " << c["size"] << " seed " << c["seed"] << " epoch "
                             << c["epoch"] << " drop_last " << c["drop_last"];
    ++checked;
  }
  EXPECT_GT(checked, 150);
}

TEST(TorchRandperm, SmallCasesAndErrors) {
  EXPECT_TRUE(torchRandperm(0, 1).empty());
  EXPECT_EQ(torchRandperm(1, 1), (std::vector<int64_t>{0}));
  // torch.randperm(10, generator=torch.Generator().manual_seed(42)) in torch 1.13.
  EXPECT_EQ(torchRandperm(10, 42), (std::vector<int64_t>{2, 6, 1, 8, 4, 5, 0, 9, 3, 7}));
  EXPECT_EQ(torchRandperm(10, 42 + (uint64_t{1} << 32)), torchRandperm(10, 42));
  try {
    torchRandperm(-1, 0);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("n must be >= 0, got -1"));
  }
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
