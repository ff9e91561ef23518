// The tuning a group runs with (loom/comm/tuning_cache.h): every rank of a group takes one
// section and one table, also with uneven placement (3 ranks on one host, 1 on another); a rank
// whose own tuning differs is named and runs rank 0's; the per-host cache is read without being
// asked for, LOOM_TUNING_FILE beats it, and a stale, foreign or malformed cache gives one warning
// and the built-in table, which follows the topology.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/tuning.h"
#include "loom/comm/tuning_cache.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::comm {
namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Thread ranks over tcp; `host(rank)` fakes the host each rank is on.
struct GroupRun {
  std::vector<std::string> topology, tuning;
};
GroupRun runGroup(int size, const std::function<void(int, ContextOptions&)>& configure) {
  HashStore store;
  GroupRun run;
  run.topology.resize(size);
  run.tuning.resize(size);
  loom::testing::runThreadRanks(size, [&](int rank) {
    ContextOptions o;
    o.host = "127.0.0.1";
    o.sharedMemory = false;
    o.tuningCache = "off";
    o.timeout = std::chrono::seconds(60);
    configure(rank, o);
    auto ctx = Context::create(store, rank, size, o);
    run.topology[rank] = ctx->topology();
    run.tuning[rank] = ctx->tuning();
    // 8 bytes and 1 MiB: recursive doubling or the ring, whichever the agreed table says; ranks
    // that chose differently would fail here.
    for (size_t count : {size_t{2}, size_t{1} << 18}) {
      std::vector<float> buf(count, rank + 1.0f);
      CollectiveOptions opts;
      opts.seq = count;
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum, opts);
      for (float v : buf) LOOM_CHECK_EQ(v, size * (size + 1) / 2.0f);
    }
  });
  return run;
}

GroupTopology topologyOf(int world, int minPerHost, int maxPerHost, int cpus) {
  GroupTopology t;
  t.worldSize = world;
  t.hosts = 2;
  t.minPerHost = minPerHost;
  t.maxPerHost = maxPerHost;
  t.minCpus = cpus;
  t.minL2Bytes = size_t{1} << 20;
  return t;
}

// "off" turns the cache off in any case, as every other settings word; "OFF" was a relative
// directory that every group read and --tune would have written.
TEST(TuningCache, OffInAnyCaseTurnsTheCacheOff) {
  for (const char* off : {"off", "OFF", "Off"}) EXPECT_EQ(tuningCacheDirectory(off), "") << off;
  EXPECT_EQ(tuningCacheDirectory("/tmp/loom-cache"), "/tmp/loom-cache");
}

TEST(TuningCache, TheKeyAndTheBuiltInTableFollowTheTopology) {
  GroupTopology even = topologyOf(4, 2, 2, 2);
  EXPECT_EQ(even.key(), "world=4 per_host=2 transport=tcp");
  GroupTopology uneven = topologyOf(4, 1, 3, 2);
  EXPECT_EQ(uneven.key(), "world=4 per_host=1-3 transport=tcp");
  EXPECT_EQ(uneven.describe(), "4 ranks on 2 hosts (1-3 per host), 2 CPUs, L2 1 MiB");
  // A core per rank: the measured 2-rank crossover; more ranks than cores: the oversubscribed one.
  EXPECT_EQ(builtinCrossovers(even).allreduceRdMax, size_t{128} << 10);
  EXPECT_EQ(builtinCrossovers(uneven).allreduceRdMax, size_t{256} << 10);
  EXPECT_EQ(builtinCrossovers(topologyOf(16, 8, 8, 16)).allreduceRdMax, size_t{128} << 10);
  EXPECT_EQ(builtinCrossovers(topologyOf(16, 8, 8, 16)).allreduceHdMax, size_t{32} << 20);
  EXPECT_EQ(builtinCrossovers(topologyOf(16, 16, 16, 2)).allreduceRdMax, size_t{256} << 10);
  // A host's CPUs are its ranks' affinity masks together (ranks pinned to a core each).
  EXPECT_EQ(countCpus({"0-3", "2-5,8"}), 7);
  EXPECT_EQ(countCpus({"0", "1", "2", "3"}), 4);
  EXPECT_EQ(countCpus({"x", "3-", ""}), 0);
  const HostFacts& facts = hostFacts();
  EXPECT_GE(facts.cpus, 1);
  EXPECT_EQ(countCpus({facts.cpuMask}), facts.cpus) << facts.cpuMask;
  EXPECT_FALSE(facts.cpuModel.empty());
  EXPECT_EQ(hostFingerprint(facts).size(), 16u);
  HostFacts other = facts;
  other.onlineCpus += 1;
  EXPECT_NE(hostFingerprint(other), hostFingerprint(facts));
}

// 3 ranks on host "a", 1 on host "b": every rank reads the section of the whole group, not
// per_host=3 on three ranks and per_host=1 on the fourth (which the file sets apart: the ring
// from the first byte against recursive doubling up to 64 MiB).
TEST(TuningCache, UnevenPlacementTakesOneSectionOnEveryRank) {
  loom::testing::TempDir dir;
  Crossovers ring;  // every crossover 0: the ring at every size
  Crossovers rd = builtinCrossovers(4);
  rd.allreduceRdMax = size_t{64} << 20;
  const std::string uneven = "world=4 per_host=1-3 transport=tcp";
  const std::string path = dir.file("tuning.txt");
  std::ofstream(path) << formatTuning(topologyKey(4, 3, "tcp"), ring, true)
                      << formatTuning(topologyKey(4, 1, "tcp"), rd, false)
                      << formatTuning(uneven, rd, false);
  const GroupRun run = runGroup(4, [&](int rank, ContextOptions& o) {
    o.shmHostId = rank < 3 ? "host-a" : "host-b";
    o.tuningFile = path;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(run.topology[r], uneven) << "rank " << r;
    EXPECT_EQ(run.tuning[r], run.tuning[0]) << "rank " << r;
  }
  EXPECT_EQ(run.tuning[0], "LOOM_TUNING_FILE " + path + " [" + uneven + "]");
}

// Rank 2 has another tuning file: every rank runs rank 0's table, every rank's summary names
// rank 2, and rank 0 says so in one warning.
TEST(TuningCache, ARankWithOtherTuningIsNamedAndRunsRankZeros) {
  loom::testing::TempDir dir;
  Crossovers ring;
  const std::string key = topologyKey(3, 3, "tcp");
  const std::string path = dir.file("rank2.txt");
  std::ofstream(path) << formatTuning(key, ring, true);
  ::testing::internal::CaptureStderr();
  const GroupRun run = runGroup(3, [&](int rank, ContextOptions& o) {
    o.shmHostId = "one-host";
    if (rank == 2) o.tuningFile = path;
  });
  const std::string logged = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run.tuning[r], run.tuning[0]) << "rank " << r;
  EXPECT_TRUE(contains(run.tuning[0], "built-in (3 ranks on 1 host (3 per host)")) << run.tuning[0];
  EXPECT_TRUE(contains(run.tuning[0], "every rank uses rank 0's")) << run.tuning[0];
  EXPECT_TRUE(contains(run.tuning[0], "rank 2 has LOOM_TUNING_FILE " + path)) << run.tuning[0];
  EXPECT_FALSE(contains(run.tuning[0], "rank 1 has")) << run.tuning[0];
  EXPECT_EQ(occurrences(logged, "tuning differs between ranks"), 1u) << logged;
}

class CacheTest : public ::testing::Test {
 protected:
  const std::string key = topologyKey(2, 2, "tcp");
  loom::testing::TempDir dir;
  std::string cache = dir.file("cache");
  std::string path = tuningCachePath(cache, hostFacts());
  GroupTopology topology = [] {
    GroupTopology t;
    t.worldSize = 2;
    t.minPerHost = t.maxPerHost = 2;
    t.minCpus = 2;
    return t;
  }();

  // The cache as JSON, changed by `edit`, written back.
  void edit(const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json doc;
    std::ifstream(path) >> doc;
    change(doc);
    std::ofstream(path) << doc.dump();
  }
};

TEST_F(CacheTest, WrittenSectionsReadBackAndMerge) {
  Crossovers x = builtinCrossovers(2);
  x.allreduceRdMax = 4096;
  x.allreduceRules = {{0, Algorithm::kRecursiveDoubling}, {4096, Algorithm::kRing}};
  x.allgatherCma = {65536, 1 << 20};
  writeTuningCache(path, key, x, hostFacts());
  writeTuningCache(path, topologyKey(4, 4, "shm"), builtinCrossovers(4), hostFacts());
  std::string why;
  bool noSection = false;
  const auto loaded = loadTuningCache(path, key, hostFacts(), why, noSection);
  ASSERT_TRUE(loaded.has_value()) << why;
  EXPECT_EQ(tuningDigest(key, *loaded), tuningDigest(key, x));
  EXPECT_TRUE(loaded->allreduceRules == x.allreduceRules);
  EXPECT_TRUE(loaded->allgatherCma == x.allgatherCma);
  EXPECT_TRUE(
      loadTuningCache(path, topologyKey(4, 4, "shm"), hostFacts(), why, noSection).has_value())
      << why;
  EXPECT_FALSE(loadTuningCache(path, topologyKey(8, 8, "shm"), hostFacts(), why, noSection));
  EXPECT_TRUE(noSection) << why;
}

// Without LOOM_TUNING_FILE every group reads this host's cache; the file beats the cache.
TEST_F(CacheTest, GroupsReadTheCacheAndTheFileOverridesIt) {
  Crossovers ring;
  writeTuningCache(path, key, ring, hostFacts());
  GroupRun run = runGroup(2, [&](int, ContextOptions& o) { o.tuningCache = cache; });
  EXPECT_EQ(run.tuning[0], "cache " + path + " [" + key + "]");
  EXPECT_EQ(run.tuning[1], run.tuning[0]);
  const std::string file = dir.file("tuning.txt");
  std::ofstream(file) << formatTuning(key, builtinCrossovers(2), true);
  run = runGroup(2, [&](int, ContextOptions& o) {
    o.tuningCache = cache;
    o.tuningFile = file;
  });
  EXPECT_EQ(run.tuning[0], "LOOM_TUNING_FILE " + file + " [" + key + "]");
  // No section for this topology: the built-in table, no warning.
  const TuningChoice other = chooseTuning(
      "", cache,
      [] {
        GroupTopology t;
        t.worldSize = 3;
        t.minPerHost = t.maxPerHost = 3;
        return t;
      }(),
      hostFacts());
  EXPECT_FALSE(other.tuned);
  EXPECT_TRUE(other.warning.empty()) << other.warning;
  EXPECT_TRUE(contains(other.source, "has no section [world=3 per_host=3 transport=tcp]"))
      << other.source;
}

// Stale, foreign or malformed: the built-in table and one warning, however many groups read it.
TEST_F(CacheTest, StaleForeignOrMalformedCachesWarnOnceAndUseTheBuiltInTable) {
  Crossovers ring;
  const std::string builtin = tuningDigest(key, builtinCrossovers(topology));
  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& d) { d["version"] = 0; }, "is stale: written by format version 0"},
      {[](nlohmann::json& d) { d["loom"] = "0.0.1"; }, "of Loom '0.0.1'"},
      {[](nlohmann::json& d) { d["host"]["cpu_model"] = "Other CPU"; },
       "is foreign: measured on 'Other CPU'"},
      {[](nlohmann::json& d) { d["host"]["cpus"] = 4096; }, "with 4096 CPUs"},
      {[&](nlohmann::json& d) { d["sections"][key]["allreduce.rd_max"] = "lots"; },
       "'allreduce.rd_max = lots'"},
      {[&](nlohmann::json& d) { d["sections"][key]["allreduce.rd_max"] = 1.5; },
       "expected a byte count or a rules string"},
  };
  for (const Case& c : cases) {
    writeTuningCache(path, key, ring, hostFacts());
    edit(c.change);
    const TuningChoice choice = chooseTuning("", cache, topology, hostFacts());
    EXPECT_FALSE(choice.tuned) << c.expected;
    EXPECT_EQ(choice.digest, builtin) << c.expected;
    EXPECT_TRUE(contains(choice.warning, c.expected)) << choice.warning;
    EXPECT_TRUE(contains(choice.warning, path)) << choice.warning;
  }
  std::ofstream(path) << "{not json";
  const TuningChoice malformed = chooseTuning("", cache, topology, hostFacts());
  EXPECT_FALSE(malformed.tuned);
  EXPECT_TRUE(contains(malformed.warning, "is not a JSON object")) << malformed.warning;
  ::testing::internal::CaptureStderr();
  for (int group = 0; group < 2; ++group) {
    const GroupRun run = runGroup(2, [&](int, ContextOptions& o) { o.tuningCache = cache; });
    EXPECT_TRUE(contains(run.tuning[0], "built-in (cache unusable: ")) << run.tuning[0];
  }
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(logged, "is not a JSON object"), 1u) << logged;
}

}  // namespace
}  // namespace loom::comm
