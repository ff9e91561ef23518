// The flight record's JSON form (docs/diagnostics.md) and the OpRecord helpers.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/process_group.h"

namespace loom::diag {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "loom-flight-record";

// Enums travel by name so that a dump stays readable (and parseable) when values move.
template <class E>
E enumByName(const std::string& name, const char* (*nameOf)(E), int first, int last,
             const std::string& where) {
  // Out-of-range values print as "unknown" / "none": never accept those back.
  if (name == "unknown" || name == "none") {
    throw InvalidArgumentError(where + ": unknown value '" + name + "'");
  }
  for (int v = first; v <= last; ++v) {
    if (name == nameOf(static_cast<E>(v))) return static_cast<E>(v);
  }
  throw InvalidArgumentError(where + ": unknown value '" + name + "'");
}

const char* algorithmNameOf(comm::Algorithm a) {
  return comm::algorithmName(a);
}

// `node` as a T; `what` names it in errors ("rank0.json: entries[3].count").
template <class T>
T valueAs(const json& node, const std::string& what) {
  const json* it = &node;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann converts a float to an integer with a cast (undefined behaviour when out of
    // range) and wraps an integer that does not fit: only integers in T's range are taken.
    bool fits = it->is_number_integer();
    if (fits && it->is_number_unsigned()) {
      fits = it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    } else if (fits) {
      const auto v = it->get<int64_t>();
      fits = std::is_signed_v<T> ? v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                       v <= static_cast<int64_t>(std::numeric_limits<T>::max())
                                 : v >= 0;
    }
    if (!fits) {
      throw InvalidArgumentError(what + ": " + it->dump() +
                                 " is not an integer in the field's range");
    }
  }
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    throw InvalidArgumentError(what + ": " + e.what());
  }
}

template <class T>
T field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw InvalidArgumentError(where + ": missing field '" + key + "'");
  return valueAs<T>(*it, where + "." + key);
}

}  // namespace

const char* opStateName(OpState state) {
  switch (state) {
    case OpState::kQueued:
      return "queued";
    case OpState::kRunning:
      return "running";
    case OpState::kDone:
      return "done";
    case OpState::kFailed:
      return "failed";
  }
  return "?";
}

namespace {
OpDesc descOf(const OpRecord& r) {
  OpDesc d;
  d.type = r.type;
  d.dtype = r.dtype;
  d.count = r.count;
  d.reduceOp = r.reduceOp;
  d.root = r.root;
  d.seq = r.seq;
  return d;
}
}  // namespace

std::string OpRecord::describe() const {
  return descOf(*this).describe();
}

std::string OpRecord::signature() const {
  return descOf(*this).signature();
}

namespace {

json entryJson(const OpRecord& r) {
  return {{"id", r.id},
          {"seq", r.seq},
          {"op", opTypeName(r.type)},
          {"dtype", dtypeName(r.dtype)},
          {"count", r.count},
          {"bytes", r.bytes},
          {"reduce_op", reduceOpName(r.reduceOp)},
          {"root", r.root},
          {"algorithm", comm::algorithmName(r.algorithm)},
          {"state", opStateName(r.state)},
          {"peer", r.peer},
          {"issue_us", r.issueUs},
          {"start_us", r.startUs},
          {"end_us", r.endUs},
          {"precise", r.precise}};
}

OpRecord parseEntry(const json& e, const std::string& where) {
  if (!e.is_object()) throw InvalidArgumentError(where + ": not an object");
  OpRecord r;
  r.id = field<uint64_t>(e, "id", where);
  r.seq = field<uint64_t>(e, "seq", where);
  r.type = enumByName<OpType>(field<std::string>(e, "op", where), opTypeName, 1, 63, where + ".op");
  r.dtype =
      enumByName<DType>(field<std::string>(e, "dtype", where), dtypeName, 0, 63, where + ".dtype");
  r.count = field<uint64_t>(e, "count", where);
  r.bytes = field<uint64_t>(e, "bytes", where);
  r.reduceOp = enumByName<ReduceOp>(field<std::string>(e, "reduce_op", where), reduceOpName, 0, 63,
                                    where + ".reduce_op");
  r.root = field<int>(e, "root", where);
  r.algorithm = enumByName<comm::Algorithm>(field<std::string>(e, "algorithm", where),
                                            algorithmNameOf, 0, 63, where + ".algorithm");
  r.state = enumByName<OpState>(field<std::string>(e, "state", where), opStateName, 0, 3,
                                where + ".state");
  r.peer = field<int>(e, "peer", where);
  r.issueUs = field<int64_t>(e, "issue_us", where);
  r.startUs = field<int64_t>(e, "start_us", where);
  r.endUs = field<int64_t>(e, "end_us", where);
  // Optional (dumps before it was added timed every operation precisely).
  if (e.contains("precise")) r.precise = field<bool>(e, "precise", where);
  return r;
}

std::vector<int> parseRanks(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw InvalidArgumentError(where + ": missing field '" + key + "'");
  if (!it->is_array()) throw InvalidArgumentError(where + "." + key + ": not an array");
  std::vector<int> ranks;
  for (size_t i = 0; i < it->size(); ++i) {
    ranks.push_back(valueAs<int>((*it)[i], where + "." + key + "[" + std::to_string(i) + "]"));
  }
  return ranks;
}

json otherGroupJson(const OtherGroup& g) {
  return {{"group", g.group},
          {"parent_ranks", g.parentRanks},
          {"rank", g.rank},
          {"size", g.size},
          {"backend", g.backend},
          {"last_seq", g.lastSeq},
          {"op", g.op ? entryJson(*g.op) : json(nullptr)}};
}

OtherGroup parseOtherGroup(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgumentError(where + ": not an object");
  OtherGroup g;
  g.group = field<std::string>(j, "group", where);
  g.parentRanks = parseRanks(j, "parent_ranks", where);
  g.rank = field<int>(j, "rank", where);
  g.size = field<int>(j, "size", where);
  if (g.size < 1 || g.rank < 0 || g.rank >= g.size) {
    throw InvalidArgumentError(where + ": rank " + std::to_string(g.rank) +
                               " is out of range for size " + std::to_string(g.size));
  }
  g.backend = field<std::string>(j, "backend", where);
  g.lastSeq = field<uint64_t>(j, "last_seq", where);
  const auto op = j.find("op");
  if (op == j.end()) throw InvalidArgumentError(where + ": missing field 'op'");
  if (!op->is_null()) g.op = parseEntry(*op, where + ".op");
  return g;
}

}  // namespace

std::string toJson(const RankDump& d) {
  // Replacement, not an exception, for bytes that are not UTF-8 (a host name could hold any).
  const auto compact = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  // The header a field per line, then an entry per line: small in the store, readable in a
  // file, and still one JSON document.
  const json header = {{"format", kFormat},
                       {"version", kDumpFormatVersion},
                       {"rank", d.rank},
                       {"size", d.size},
                       {"group", d.group},
                       {"backend", d.backend},
                       {"host", d.host},
                       {"pid", d.pid},
                       {"reason", d.reason},
                       {"time_us", d.timeUs},
                       {"capacity", d.capacity},
                       {"recorded", d.recorded},
                       {"last_seq", d.lastSeq},
                       {"clock_offset_us", d.clockOffsetUs},
                       {"clock_error_us", d.clockErrorUs},
                       {"parent_ranks", d.parentRanks}};
  std::string out = "{\n";
  for (const char* key :
       {"format", "version", "rank", "size", "group", "backend", "host", "pid", "reason", "time_us",
        "capacity", "recorded", "last_seq", "clock_offset_us", "clock_error_us", "parent_ranks"}) {
    out += " \"" + std::string(key) + "\": " + compact(header.at(key)) + ",\n";
  }
  // An array of one object per line.
  const auto lines = [&](const char* key, const std::vector<json>& items) {
    out += " \"" + std::string(key) + "\": [";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n  " : "\n  ") + compact(items[i]);
    out += items.empty() ? "]" : "\n ]";
  };
  std::vector<json> items;
  for (const OtherGroup& g : d.otherGroups) items.push_back(otherGroupJson(g));
  lines("other_groups", items);
  out += ",\n";
  items.clear();
  for (const OpRecord& r : d.entries) items.push_back(entryJson(r));
  lines("entries", items);
  out += "\n}\n";
  return out;
}

RankDump parseDump(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1; the offset counts from 0 (== size: the text ended too early).
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    throw InvalidArgumentError(
        source + ": not a valid flight record: corrupt or truncated JSON at byte " +
        std::to_string(offset) + " of " + std::to_string(text.size()) + " (" + e.what() + ")");
  } catch (const json::exception& e) {
    // A number the JSON parser cannot hold (1e705) is an out_of_range, not a parse_error.
    throw InvalidArgumentError(source + ": not a valid flight record: " + e.what());
  }
  if (!j.is_object()) throw InvalidArgumentError(source + ": not a flight record (not an object)");
  const std::string format = field<std::string>(j, "format", source);
  if (format != kFormat) {
    throw InvalidArgumentError(source + ": format is '" + format + "', expected '" + kFormat + "'");
  }
  const int version = field<int>(j, "version", source);
  if (version < 1 || version > kDumpFormatVersion) {
    throw InvalidArgumentError(source + ": format version " + std::to_string(version) +
                               " is not supported (this build reads versions 1 to " +
                               std::to_string(kDumpFormatVersion) + ")");
  }
  RankDump d;
  d.rank = field<int>(j, "rank", source);
  d.size = field<int>(j, "size", source);
  if (d.size < 1 || d.rank < 0 || d.rank >= d.size) {
    throw InvalidArgumentError(source + ": rank " + std::to_string(d.rank) +
                               " is out of range for size " + std::to_string(d.size));
  }
  d.group = field<std::string>(j, "group", source);
  d.backend = field<std::string>(j, "backend", source);
  d.host = field<std::string>(j, "host", source);
  d.pid = field<int64_t>(j, "pid", source);
  d.reason = field<std::string>(j, "reason", source);
  d.timeUs = field<int64_t>(j, "time_us", source);
  d.capacity = field<uint64_t>(j, "capacity", source);
  d.recorded = field<uint64_t>(j, "recorded", source);
  d.lastSeq = field<uint64_t>(j, "last_seq", source);
  // Optional (dumps before the clock offset was estimated: 0, no correction).
  if (j.contains("clock_offset_us")) d.clockOffsetUs = field<int64_t>(j, "clock_offset_us", source);
  if (j.contains("clock_error_us")) d.clockErrorUs = field<int64_t>(j, "clock_error_us", source);
  // Version 2: the group's parent ranks and the process's other groups (version 1: none).
  if (version >= 2) {
    d.parentRanks = parseRanks(j, "parent_ranks", source);
    const auto others = j.find("other_groups");
    if (others == j.end() || !others->is_array()) {
      throw InvalidArgumentError(source + ": missing array 'other_groups'");
    }
    for (size_t i = 0; i < others->size(); ++i) {
      d.otherGroups.push_back(
          parseOtherGroup((*others)[i], source + ": other_groups[" + std::to_string(i) + "]"));
    }
  }
  const auto it = j.find("entries");
  if (it == j.end() || !it->is_array()) {
    throw InvalidArgumentError(source + ": missing array 'entries'");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    d.entries.push_back(parseEntry((*it)[i], source + ": entries[" + std::to_string(i) + "]"));
  }
  return d;
}

}  // namespace loom::diag
