// libFuzzer target: the per-host tuning cache (comm/src/tuning_cache.cc,
// loom/comm/tuning_cache.h), a JSON file read by every group on the host. The first byte picks
// the topology key the reader looks for; the rest is the file. Built with
// LOOM_VERSION_STRING="fuzz", and read as the cache of a host "Fuzz CPU" with 8 CPUs, so that
// the seeds (corpus/tuning_cache) reach the sections.
//
// Properties:
// - neither loadTuningCache nor chooseTuning (the file as LOOM_TUNING_FILE, or as the cache)
//   throws: a file they cannot use is refused with a reason naming it, and chooseTuning then
//   gives the built-in table with one warning (none when only the section is missing);
// - what loadTuningCache accepts, writeTuningCache writes back and reads back to the same table.
#include <optional>
#include <string>

#include "fuzz_support.h"
#include "loom/comm/tuning.h"
#include "loom/comm/tuning_cache.h"

namespace {

using namespace loom::comm;

HostFacts fuzzHost() {
  HostFacts f;
  f.cpuModel = "Fuzz CPU";
  f.onlineCpus = 8;
  f.cpus = 8;
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  GroupTopology topology;
  topology.worldSize = 2;
  topology.minPerHost = topology.maxPerHost = 2;
  topology.minCpus = 8;
  if (data[0] % 2 == 1) {
    topology.worldSize = 4;
    topology.hosts = 2;
    topology.minPerHost = 1;
    topology.maxPerHost = 3;
    topology.transport = "shm+tcp";
  }
  const std::string key = topology.key();
  const HostFacts facts = fuzzHost();
  const std::string path = loom::fuzz::writeScratch("tuning_cache", data + 1, size - 1);
  std::optional<Crossovers> loaded;
  try {
    std::string why;
    bool noSection = false;
    loaded = loadTuningCache(path, key, facts, why, noSection);
    LOOM_FUZZ_CHECK(loaded || why.find(path) != std::string::npos,
                    "refused without naming the file: %s", why.c_str());
    const TuningChoice asFile = chooseTuning(path, "", topology, facts);
    LOOM_FUZZ_CHECK(asFile.tuned || !asFile.warning.empty(), "an unusable file gave no warning");
    LOOM_FUZZ_CHECK(asFile.tuned || asFile.digest == tuningDigest(key, builtinCrossovers(topology)),
                    "an unusable file did not give the built-in table");
    LOOM_FUZZ_CHECK(!loaded || asFile.tuned, "the cache loads but not as LOOM_TUNING_FILE");
  } catch (const std::exception& e) {
    LOOM_FUZZ_CHECK(false, "reading the cache threw: %s", e.what());
  }
  if (!loaded) return 0;
  const std::string copy = path + ".written";
  try {
    writeTuningCache(copy, key, *loaded, facts);
    std::string why;
    bool noSection = false;
    const std::optional<Crossovers> again = loadTuningCache(copy, key, facts, why, noSection);
    LOOM_FUZZ_CHECK(again.has_value(), "writeTuningCache's output is refused: %s", why.c_str());
    LOOM_FUZZ_CHECK(tuningDigest(key, *again) == tuningDigest(key, *loaded),
                    "writeTuningCache's output reads back otherwise");
  } catch (const std::exception& e) {
    LOOM_FUZZ_CHECK(false, "writing the cache threw: %s", e.what());
  }
  return 0;
}
