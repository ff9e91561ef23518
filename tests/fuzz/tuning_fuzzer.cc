// libFuzzer target: the tuning file (comm/src/tuning.cc, loom/comm/tuning.h), read as a Context
// reads it: loadTuning(path, key). The first byte picks the topology key the reader looks for
// (a fixed one, or the input's first section, so that the section's fields are reached); the
// rest is the file.
//
// Properties:
// - loadTuning never throws: a file it cannot use is nullopt with `why` naming the file;
// - what it accepts is well formed: every per-size rule list starts at 0, rises strictly and
//   names algorithms its operation implements; every cross-memory range has min <= max (or
//   max 0, never);
// - formatTuning of what was read reads back to the same crossovers (a cross-memory range with
//   max 0 means never whatever its min, and formats as absent), and formatting is stable.
#include <optional>
#include <string>

#include "fuzz_support.h"
#include "loom/comm/tuning.h"

namespace {

using namespace loom::comm;
using loom::OpType;

CrossMemoryRange normalised(CrossMemoryRange r) {
  return r.max == 0 ? CrossMemoryRange{} : r;
}

bool same(const Crossovers& a, const Crossovers& b) {
  return a.allreduceRdMax == b.allreduceRdMax && a.allreduceHdMax == b.allreduceHdMax &&
         a.broadcastTreeMax == b.broadcastTreeMax && a.gatherDirectMax == b.gatherDirectMax &&
         normalised(a.allreduceCma) == normalised(b.allreduceCma) &&
         normalised(a.broadcastCma) == normalised(b.broadcastCma) &&
         normalised(a.allgatherCma) == normalised(b.allgatherCma) &&
         normalised(a.reduceScatterCma) == normalised(b.reduceScatterCma) &&
         a.allreduceRules == b.allreduceRules && a.broadcastRules == b.broadcastRules &&
         a.allgatherRules == b.allgatherRules && a.reduceScatterRules == b.reduceScatterRules;
}

void checkWellFormed(const Crossovers& c) {
  const std::pair<OpType, const SizeRules*> rules[] = {
      {OpType::kAllreduce, &c.allreduceRules},
      {OpType::kBroadcast, &c.broadcastRules},
      {OpType::kAllgather, &c.allgatherRules},
      {OpType::kReduceScatter, &c.reduceScatterRules}};
  for (const auto& [kind, list] : rules) {
    for (size_t i = 0; i < list->size(); ++i) {
      const SizeRule& r = (*list)[i];
      LOOM_FUZZ_CHECK(i > 0 || r.from == 0, "%s rules start at %zu", opTypeName(kind), r.from);
      LOOM_FUZZ_CHECK(i == 0 || r.from > (*list)[i - 1].from, "%s rules do not rise",
                      opTypeName(kind));
      LOOM_FUZZ_CHECK(implementsAlgorithm(kind, r.algorithm), "%s rule names %s", opTypeName(kind),
                      algorithmName(r.algorithm));
      // The choice for the sizes a rule starts at is that rule's.
      LOOM_FUZZ_CHECK(ruleFor(*list, r.from) == r.algorithm, "%s: ruleFor(%zu) is not its rule",
                      opTypeName(kind), r.from);
    }
  }
  for (const CrossMemoryRange* r :
       {&c.allreduceCma, &c.broadcastCma, &c.allgatherCma, &c.reduceScatterCma}) {
    LOOM_FUZZ_CHECK(r->max == 0 || r->min <= r->max, "range [%zu, %zu]", r->min, r->max);
  }
}

std::optional<Crossovers> load(const std::string& text, const std::string& key, std::string& why) {
  const std::string path = loom::fuzz::writeScratch(
      "tuning", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  try {
    auto c = loadTuning(path, key, why);
    LOOM_FUZZ_CHECK(c || why.find(path) != std::string::npos,
                    "rejected without naming the file: %s", why.c_str());
    return c;
  } catch (const std::exception& e) {
    LOOM_FUZZ_CHECK(false, "loadTuning threw: %s", e.what());
  }
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string key = topologyKey(2, 2, "tcp");
  if (data[0] % 3 == 1) key = topologyKey(4, 1, "shm+tcp");
  if (data[0] % 3 == 2) {
    // The first section the file names, whatever it is.
    const size_t open = text.find('[');
    const size_t close = open == std::string::npos ? open : text.find(']', open);
    if (close != std::string::npos) key = text.substr(open + 1, close - open - 1);
  }
  std::string why;
  const std::optional<Crossovers> c = load(text, key, why);
  if (!c) return 0;
  checkWellFormed(*c);
  // Only a key that fits in a section line can be written back.
  if (key.find_first_of("\n\r") != std::string::npos || key.find(']') != std::string::npos) {
    return 0;
  }
  const std::string formatted = formatTuning(key, *c, true);
  std::string whyAgain;
  const std::optional<Crossovers> again = load(formatted, key, whyAgain);
  LOOM_FUZZ_CHECK(again.has_value(), "formatTuning's output is refused: %s\n%s", whyAgain.c_str(),
                  formatted.c_str());
  LOOM_FUZZ_CHECK(same(*c, *again), "formatTuning's output reads back otherwise:\n%s",
                  formatted.c_str());
  LOOM_FUZZ_CHECK(formatTuning(key, *again, true) == formatted, "formatting is not stable");
  // The choice a group makes from them is defined for every size.
  for (OpType kind :
       {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather, OpType::kReduceScatter}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20, ~size_t{0}}) {
      for (int world : {2, 3, 4, 8}) (void)automaticAlgorithm(kind, bytes, world, *c);
    }
  }
  return 0;
}
