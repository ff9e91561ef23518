// The tuning file (loom/comm/tuning.h): a good file's section for the topology
// changes the automatic algorithm choice; a malformed, stale or missing file, or one without
// the topology, is refused with a reason naming the file (and the line) and the built-in
// table stays; a Context given an unusable file still works.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "algorithms/select.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/tuning.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::comm {
namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

std::string write(loom::testing::TempDir& dir, const std::string& text) {
  const std::string path = dir.file("tuning.txt");
  std::ofstream(path) << text;
  return path;
}

const std::string kKey = topologyKey(2, 2, "tcp");

TEST(Tuning, GoodFileChangesTheChoice) {
  loom::testing::TempDir dir;
  Crossovers x;
  x.allreduceRdMax = 0;  // ring from the first byte
  x.allreduceHdMax = 0;
  x.broadcastTreeMax = 1 << 20;
  x.gatherDirectMax = 16 << 20;
  const std::string path =
      write(dir, formatTuning(topologyKey(4, 4, "tcp"), builtinCrossovers(4), true) +
                     formatTuning(kKey, x, false));
  std::string why;
  const auto loaded = loadTuning(path, kKey, why);
  ASSERT_TRUE(loaded.has_value()) << why;
  EXPECT_EQ(loaded->allreduceRdMax, 0u);
  EXPECT_EQ(loaded->gatherDirectMax, size_t{16} << 20);
  const Algorithm builtin =
      selectAlgorithm(OpType::kAllreduce, Algorithm::kAuto, Algorithm::kAuto, 8, 2);
  const Algorithm tuned =
      selectAlgorithm(OpType::kAllreduce, Algorithm::kAuto, Algorithm::kAuto, 8, 2, &*loaded);
  EXPECT_EQ(builtin, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(tuned, Algorithm::kRing);
  EXPECT_EQ(
      selectAlgorithm(OpType::kAllgather, Algorithm::kAuto, Algorithm::kAuto, 1 << 20, 2, &*loaded),
      Algorithm::kDirect);
  EXPECT_EQ(selectAlgorithm(OpType::kAllgather, Algorithm::kAuto, Algorithm::kAuto, 1 << 20, 2),
            Algorithm::kRing);
}

TEST(Tuning, MalformedLineIsRefusedNamingIt) {
  loom::testing::TempDir dir;
  const std::string path =
      write(dir, "# loom tuning v1\n[" + kKey + "]\nallreduce.rd_max = lots\n");
  std::string why;
  EXPECT_FALSE(loadTuning(path, kKey, why).has_value());
  EXPECT_TRUE(contains(why, "line 3")) << why;
  EXPECT_TRUE(contains(why, "allreduce.rd_max = lots")) << why;
}

TEST(Tuning, StaleVersionIsRefused) {
  loom::testing::TempDir dir;
  const std::string path = write(dir, "# loom tuning v0\n[" + kKey + "]\n");
  std::string why;
  EXPECT_FALSE(loadTuning(path, kKey, why).has_value());
  EXPECT_TRUE(contains(why, "expected '# loom tuning v1'")) << why;
}

TEST(Tuning, MissingFileIsRefused) {
  std::string why;
  EXPECT_FALSE(loadTuning("/nonexistent/loom-tuning.txt", kKey, why).has_value());
  EXPECT_TRUE(contains(why, "cannot read tuning file /nonexistent/loom-tuning.txt")) << why;
}

TEST(Tuning, WrongTopologyIsRefusedListingWhatIsThere) {
  loom::testing::TempDir dir;
  const std::string path =
      write(dir, formatTuning(topologyKey(4, 2, "tcp"), builtinCrossovers(4), true));
  std::string why;
  EXPECT_FALSE(loadTuning(path, kKey, why).has_value());
  EXPECT_TRUE(contains(why, "no section [world=2 per_host=2 transport=tcp]")) << why;
  EXPECT_TRUE(contains(why, "[world=4 per_host=2 transport=tcp]")) << why;
}

TEST(Tuning, IncompleteSectionIsRefused) {
  loom::testing::TempDir dir;
  const std::string path = write(dir, "# loom tuning v1\n[" + kKey + "]\nallreduce.rd_max = 0\n");
  std::string why;
  EXPECT_FALSE(loadTuning(path, kKey, why).has_value());
  EXPECT_TRUE(contains(why, "sets 1 of the 4 crossovers")) << why;
}

TEST(Tuning, CrossMemoryRangesRoundTripAndAreOptional) {
  loom::testing::TempDir dir;
  Crossovers x = builtinCrossovers(2);
  x.allgatherCma = {65536, 16 << 20};
  x.broadcastCma = {65536, 1 << 20};
  const std::string key = topologyKey(2, 2, "shm");
  const std::string text = formatTuning(key, x, true);
  EXPECT_TRUE(contains(text, "allgather.cma_min = 65536\nallgather.cma_max = 16777216\n")) << text;
  EXPECT_FALSE(contains(text, "allreduce.cma")) << "a range that is never on is not written";
  std::string why;
  const auto loaded = loadTuning(write(dir, text), key, why);
  ASSERT_TRUE(loaded.has_value()) << why;
  EXPECT_TRUE(loaded->allgatherCma == x.allgatherCma);
  EXPECT_TRUE(loaded->broadcastCma == x.broadcastCma);
  EXPECT_EQ(loaded->allreduceCma.max, 0u);
  EXPECT_TRUE(loaded->allgatherCma.contains(65536));
  EXPECT_TRUE(loaded->allgatherCma.contains(16 << 20));
  EXPECT_FALSE(loaded->allgatherCma.contains(65535));
  EXPECT_FALSE(loaded->allgatherCma.contains((16 << 20) + 1));
  EXPECT_FALSE(loaded->reduceScatterCma.contains(1 << 20));
  // A file without them (tuned before they existed) still loads: never.
  const auto old = loadTuning(write(dir, formatTuning(key, builtinCrossovers(2), true)), key, why);
  ASSERT_TRUE(old.has_value()) << why;
  EXPECT_FALSE(old->allgatherCma.contains(1 << 20));
}

TEST(Tuning, BadCrossMemoryRangesAreRefusedNamingThem) {
  loom::testing::TempDir dir;
  const std::string head = formatTuning(kKey, builtinCrossovers(2), true);
  std::string why;
  EXPECT_FALSE(loadTuning(write(dir, head + "allgather.cma_min = 2048\nallgather.cma_max = 1024\n"),
                          kKey, why)
                   .has_value());
  EXPECT_TRUE(contains(why, "allgather.cma_min (2048) is above allgather.cma_max (1024)")) << why;
  EXPECT_FALSE(loadTuning(write(dir, head + "gather.cma_min = 1\n"), kKey, why).has_value());
  EXPECT_TRUE(contains(why, "'gather.cma_min = 1'")) << why;
  EXPECT_TRUE(contains(why, "OP.cma_min / OP.cma_max")) << why;
  EXPECT_FALSE(loadTuning(write(dir, head + "broadcast.cma_max = -1\n"), kKey, why).has_value());
  EXPECT_TRUE(contains(why, "line 7")) << why;
}

// Per-size rules decide before the crossovers, round-trip through the file, and are optional.
TEST(Tuning, SizeRulesRoundTripAndDecide) {
  loom::testing::TempDir dir;
  Crossovers x = builtinCrossovers(4);
  x.broadcastTreeMax = 0;  // the crossover alone would chain from the first byte
  x.broadcastRules = {
      {0, Algorithm::kTree}, {131072, Algorithm::kChain}, {1 << 20, Algorithm::kTree}};
  x.allreduceRules = {{0, Algorithm::kHalvingDoubling}};
  const std::string key = topologyKey(4, 4, "tcp");
  const std::string text = formatTuning(key, x, true);
  EXPECT_TRUE(contains(text, "\nbroadcast.rules = 0:tree 131072:chain 1048576:tree\n")) << text;
  EXPECT_TRUE(contains(text, "\nallreduce.rules = 0:hd\n")) << text;
  EXPECT_FALSE(contains(text, "allgather.rules")) << "empty rules are not written";
  std::string why;
  const auto loaded = loadTuning(write(dir, text), key, why);
  ASSERT_TRUE(loaded.has_value()) << why;
  EXPECT_TRUE(loaded->broadcastRules == x.broadcastRules);
  EXPECT_TRUE(loaded->allreduceRules == x.allreduceRules);
  EXPECT_TRUE(loaded->allgatherRules.empty());
  auto pick = [&](OpType op, size_t bytes) {
    return selectAlgorithm(op, Algorithm::kAuto, Algorithm::kAuto, bytes, 4, &*loaded);
  };
  EXPECT_EQ(pick(OpType::kBroadcast, 8), Algorithm::kTree);
  EXPECT_EQ(pick(OpType::kBroadcast, 131071), Algorithm::kTree);
  EXPECT_EQ(pick(OpType::kBroadcast, 131072), Algorithm::kChain);
  EXPECT_EQ(pick(OpType::kBroadcast, (1 << 20) - 1), Algorithm::kChain);
  EXPECT_EQ(pick(OpType::kBroadcast, 1 << 20), Algorithm::kTree);
  EXPECT_EQ(pick(OpType::kBroadcast, size_t{1} << 30), Algorithm::kTree);
  EXPECT_EQ(pick(OpType::kAllreduce, 8), Algorithm::kHalvingDoubling);
  // No rules for all-gather: its crossover decides, as without rules.
  EXPECT_EQ(pick(OpType::kAllgather, 8), automaticAlgorithm(OpType::kAllgather, 8, 4, x));
  EXPECT_EQ(pick(OpType::kAllgather, 64 << 20), Algorithm::kRing);
  // A forced algorithm still wins over the rules.
  EXPECT_EQ(
      selectAlgorithm(OpType::kBroadcast, Algorithm::kDirect, Algorithm::kAuto, 8, 4, &*loaded),
      Algorithm::kDirect);
  EXPECT_EQ(ruleFor({}, 8), Algorithm::kAuto);
}

TEST(Tuning, BadSizeRulesAreRefusedNamingThem) {
  loom::testing::TempDir dir;
  const std::string head = formatTuning(kKey, builtinCrossovers(2), true);
  const struct {
    std::string line, expected;
  } cases[] = {
      {"broadcast.rules = 1024:tree", "starts at 1024; expected 0"},
      {"broadcast.rules = 0:ring", "'ring' is not an algorithm broadcast implements"},
      {"allreduce.rules = 0:rd 4096:ring 4096:hd", "does not start above the previous one (4096)"},
      {"allgather.rules = 0:ring x", "entry 'x' is not BYTES:ALGORITHM"},
      {"reduce_scatter.rules = 0:fastest", "'fastest' is not an algorithm reduce_scatter"},
      {"allgather.rules =", "no entries"},
      {"allgather.rules = 99999999999999999999:ring", "is not BYTES:ALGORITHM"},
  };
  for (const auto& c : cases) {
    std::string why;
    EXPECT_FALSE(loadTuning(write(dir, head + c.line + "\n"), kKey, why).has_value()) << c.line;
    EXPECT_TRUE(contains(why, "line 7")) << why;
    EXPECT_TRUE(contains(why, c.expected)) << c.line << ": " << why;
    EXPECT_TRUE(contains(why, "OP.rules = 0:ALGORITHM")) << why;
  }
  std::string why;
  EXPECT_FALSE(loadTuning(write(dir, head + "gather.rules = 0:direct\n"), kKey, why).has_value());
  EXPECT_TRUE(contains(why, "OP.rules for OP allreduce")) << why;
}

// A Context with a good file or an unusable one is created and computes the same results.
TEST(Tuning, ContextsWithGoodAndBadFilesWork) {
  loom::testing::TempDir dir;
  Crossovers ring;  // every crossover 0: ring all-reduce, chain broadcast, ring all-gather
  const std::string good = dir.file("good.txt");
  std::ofstream(good) << formatTuning(kKey, ring, true);
  const std::string bad = dir.file("bad.txt");
  std::ofstream(bad) << "not a tuning file\n";
  for (const std::string& path : {good, bad}) {
    HashStore store;
    loom::testing::runThreadRanks(2, [&](int rank) {
      ContextOptions o;
      o.host = "127.0.0.1";
      o.sharedMemory = false;
      o.tuningFile = path;
      auto ctx = Context::create(store, rank, 2, o);
      std::vector<float> buf(1000, rank + 1.0f);
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
      for (float v : buf) LOOM_CHECK_EQ(v, 3.0f);
    });
  }
}

}  // namespace
}  // namespace loom::comm
