// libFuzzer target: the flight record dumps loom-doctor reads (process_group/src/diagnostics/
// dump_json.cc: parseDump), and the analysis it runs on them (analysis.cc: explain).
//
// Properties:
// - a dump is either read or refused with InvalidArgumentError (diagnostics.h's documented
//   error), never anything else (no nlohmann exception escaping, no undefined behaviour from a
//   number that does not fit its field);
// - what was read is a dump of a rank inside its group, and toJson of it reads back to the same
//   dump, and writes the same text again;
// - explain() of the dump (as loom-doctor groups it: this rank's record, the others missing, and
//   again with a second rank holding the same record) never throws and says something.
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"

namespace {

using namespace loom::diag;

bool sameRecord(const OpRecord& a, const OpRecord& b) {
  return a.id == b.id && a.seq == b.seq && a.type == b.type && a.dtype == b.dtype &&
         a.reduceOp == b.reduceOp && a.root == b.root && a.algorithm == b.algorithm &&
         a.count == b.count && a.bytes == b.bytes && a.state == b.state && a.peer == b.peer &&
         a.issueUs == b.issueUs && a.startUs == b.startUs && a.endUs == b.endUs &&
         a.precise == b.precise;
}

bool sameDump(const RankDump& a, const RankDump& b) {
  if (a.rank != b.rank || a.size != b.size || a.group != b.group || a.backend != b.backend ||
      a.host != b.host || a.pid != b.pid || a.reason != b.reason || a.timeUs != b.timeUs ||
      a.capacity != b.capacity || a.recorded != b.recorded || a.lastSeq != b.lastSeq ||
      a.entries.size() != b.entries.size()) {
    return false;
  }
  for (size_t i = 0; i < a.entries.size(); ++i) {
    if (!sameRecord(a.entries[i], b.entries[i])) return false;
  }
  return true;
}

// Whether `s` is valid UTF-8 (toJson replaces what is not, so only those strings round-trip).
bool utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  RankDump d;
  if (!loom::fuzz::rejectsOnlyWith<loom::InvalidArgumentError>(
          [&] { d = parseDump(text, "fuzz.json"); })) {
    return 0;
  }
  LOOM_FUZZ_CHECK(d.size >= 1 && d.rank >= 0 && d.rank < d.size, "rank %d of %d accepted", d.rank,
                  d.size);
  const std::string json = toJson(d);
  RankDump back;
  LOOM_FUZZ_CHECK(loom::fuzz::rejectsOnlyWith<loom::InvalidArgumentError>(
                      [&] { back = parseDump(json, "again.json"); }),
                  "toJson's output is refused:\n%s", json.c_str());
  if (utf8(d.group) && utf8(d.backend) && utf8(d.host) && utf8(d.reason)) {
    LOOM_FUZZ_CHECK(sameDump(d, back), "toJson's output reads back otherwise:\n%s", json.c_str());
    LOOM_FUZZ_CHECK(toJson(back) == json, "toJson is not stable");
  }
  // The analysis, over a group as large as the dump says (bounded: loom-doctor allocates one
  // slot per rank, which a real group size keeps small).
  if (d.size <= 64) {
    std::vector<std::optional<RankDump>> dumps(static_cast<size_t>(d.size));
    dumps[static_cast<size_t>(d.rank)] = d;
    std::string said;
    try {
      said = explain(dumps);
      if (d.size > 1) {
        RankDump other = d;
        other.rank = (d.rank + 1) % d.size;
        dumps[static_cast<size_t>(other.rank)] = other;
        said += explain(dumps, std::vector<std::string>(dumps.size(), "dead: fuzz"));
      }
    } catch (const std::exception& e) {
      LOOM_FUZZ_CHECK(false, "explain threw: %s", e.what());
    }
    LOOM_FUZZ_CHECK(!said.empty(), "explain said nothing");
  }
  return 0;
}
