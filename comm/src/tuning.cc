#include "loom/comm/tuning.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "loom/common/error.h"

namespace loom::comm {

namespace {

constexpr const char* kVersionLine = "# loom tuning v1";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The range of operation `op` ("allgather"), or null.
CrossMemoryRange* crossMemoryRange(Crossovers& c, const std::string& op) {
  return op == "allreduce"        ? &c.allreduceCma
         : op == "broadcast"      ? &c.broadcastCma
         : op == "allgather"      ? &c.allgatherCma
         : op == "reduce_scatter" ? &c.reduceScatterCma
                                  : nullptr;
}

// The field that "OP.cma_min" or "OP.cma_max" names, or null.
size_t* crossMemoryField(Crossovers& c, const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return nullptr;
  CrossMemoryRange* range = crossMemoryRange(c, name.substr(0, dot));
  if (range == nullptr) return nullptr;
  const std::string bound = name.substr(dot + 1);
  return bound == "cma_min" ? &range->min : bound == "cma_max" ? &range->max : nullptr;
}

// The rules of operation `op` ("broadcast"), or null; `kind` gets its OpType.
SizeRules* sizeRules(Crossovers& c, const std::string& op, OpType& kind) {
  if (op == "allreduce") return kind = OpType::kAllreduce, &c.allreduceRules;
  if (op == "broadcast") return kind = OpType::kBroadcast, &c.broadcastRules;
  if (op == "allgather") return kind = OpType::kAllgather, &c.allgatherRules;
  if (op == "reduce_scatter") return kind = OpType::kReduceScatter, &c.reduceScatterRules;
  return nullptr;
}

// Parses "0:tree 131072:chain" for `kind`; an empty string with `rules` set, or what was wrong.
std::string parseRules(const std::string& text, OpType kind, SizeRules& rules) {
  std::istringstream in(text);
  std::string entry;
  rules.clear();
  while (in >> entry) {
    const size_t colon = entry.find(':');
    const std::string from = colon == std::string::npos ? "" : entry.substr(0, colon);
    const std::string name = colon == std::string::npos ? "" : entry.substr(colon + 1);
    SizeRule rule;
    if (from.empty() || from.find_first_not_of("0123456789") != std::string::npos ||
        from.size() > 19) {
      return detail::str("entry '", entry, "' is not BYTES:ALGORITHM");
    }
    rule.from = std::stoull(from);
    try {
      rule.algorithm = parseAlgorithm(name);
    } catch (const Error&) {
      rule.algorithm = Algorithm::kAuto;
    }
    if (!implementsAlgorithm(kind, rule.algorithm)) {
      return detail::str("entry '", entry, "': '", name, "' is not an algorithm ", opTypeName(kind),
                         " implements");
    }
    if (rules.empty() && rule.from != 0) {
      return detail::str("the first entry '", entry, "' starts at ", rule.from,
                         "; expected 0 (every size needs a choice)");
    }
    if (!rules.empty() && rule.from <= rules.back().from) {
      return detail::str("entry '", entry, "' does not start above the previous one (",
                         rules.back().from, ")");
    }
    rules.push_back(rule);
  }
  if (rules.empty()) return "no entries";
  return {};
}

}  // namespace

std::string topologyKey(int worldSize, int ranksPerHost, const std::string& transport) {
  return detail::str("world=", worldSize, " per_host=", ranksPerHost, " transport=", transport);
}

std::optional<Crossovers> loadTuning(const std::string& path, const std::string& key,
                                     std::string& why) {
  std::ifstream file(path);
  if (!file) {
    why = detail::str("cannot read tuning file ", path, ": ", detail::errnoText(errno));
    return std::nullopt;
  }
  std::ostringstream text;
  text << file.rdbuf();
  return parseTuning(text.str(), path, key, why);
}

std::optional<Crossovers> parseTuning(const std::string& text, const std::string& path,
                                      const std::string& key, std::string& why) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || trim(line) != kVersionLine) {
    why = detail::str("tuning file ", path, " starts with '", trim(line), "'; expected '",
                      kVersionLine, "' (written by another version? run loom-bench --tune again)");
    return std::nullopt;
  }
  std::string section, sections;
  Crossovers found;
  bool inKey = false, seen = false;
  int fields = 0;
  for (int number = 2; std::getline(in, line); ++number) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        why = detail::str("tuning file ", path, " line ", number, ": '", line,
                          "'; expected '[world=N per_host=N transport=NAME]'");
        return std::nullopt;
      }
      section = line.substr(1, line.size() - 2);
      sections += detail::str(sections.empty() ? "" : ", ", "[", section, "]");
      inKey = section == key;
      seen = seen || inKey;
      continue;
    }
    const size_t eq = line.find('=');
    std::string name = eq == std::string::npos ? "" : trim(line.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : trim(line.substr(eq + 1));
    size_t* field = name == "allreduce.rd_max"     ? &found.allreduceRdMax
                    : name == "allreduce.hd_max"   ? &found.allreduceHdMax
                    : name == "broadcast.tree_max" ? &found.broadcastTreeMax
                    : name == "gather.direct_max"  ? &found.gatherDirectMax
                                                   : nullptr;
    const bool required = field != nullptr;
    if (field == nullptr) field = crossMemoryField(found, name);
    const size_t dot = name.find('.');
    OpType kind = OpType::kAllreduce;
    SizeRules* rules = dot != std::string::npos && name.substr(dot + 1) == "rules"
                           ? sizeRules(found, name.substr(0, dot), kind)
                           : nullptr;
    if (rules != nullptr && !section.empty()) {
      SizeRules parsed;
      const std::string wrong = parseRules(value, kind, parsed);
      if (!wrong.empty()) {
        why = detail::str("tuning file ", path, " line ", number, ": '", line, "': ", wrong,
                          "; expected 'OP.rules = 0:ALGORITHM BYTES:ALGORITHM ...' with rising "
                          "byte counts");
        return std::nullopt;
      }
      if (inKey) *rules = std::move(parsed);
      continue;
    }
    size_t bytes = 0;
    bool numberOk = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
    if (numberOk) {
      try {
        bytes = std::stoull(value);
      } catch (const std::exception&) {
        numberOk = false;  // out of range
      }
    }
    if (section.empty() || field == nullptr || !numberOk) {
      why = detail::str("tuning file ", path, " line ", number, ": '", line,
                        "'; expected 'NAME = BYTES' (allreduce.rd_max, allreduce.hd_max, "
                        "broadcast.tree_max, gather.direct_max, or OP.cma_min / OP.cma_max / "
                        "OP.rules for OP allreduce, broadcast, allgather, reduce_scatter) inside a "
                        "[topology] section");
      return std::nullopt;
    }
    if (inKey) {
      *field = bytes;
      fields += required;
    }
  }
  if (!seen) {
    why = detail::str("tuning file ", path, " has no section [", key, "] (it has ",
                      sections.empty() ? "none" : sections,
                      "); run loom-bench --tune on this topology");
    return std::nullopt;
  }
  if (fields != 4) {
    why = detail::str("tuning file ", path, " section [", key, "] sets ", fields,
                      " of the 4 crossovers; expected allreduce.rd_max, allreduce.hd_max, "
                      "broadcast.tree_max and gather.direct_max");
    return std::nullopt;
  }
  for (const char* op : {"allreduce", "broadcast", "allgather", "reduce_scatter"}) {
    const CrossMemoryRange& range = *crossMemoryRange(found, op);
    if (range.max != 0 && range.min > range.max) {
      why = detail::str("tuning file ", path, " section [", key, "]: ", op, ".cma_min (", range.min,
                        ") is above ", op, ".cma_max (", range.max,
                        "); expected min <= max, or max = 0 for never");
      return std::nullopt;
    }
  }
  return found;
}

std::string formatTuning(const std::string& key, const Crossovers& c, bool header) {
  std::ostringstream out;
  if (header) out << kVersionLine << "\n";
  out << "[" << key << "]\n"
      << "allreduce.rd_max = " << c.allreduceRdMax << "\n"
      << "allreduce.hd_max = " << c.allreduceHdMax << "\n"
      << "broadcast.tree_max = " << c.broadcastTreeMax << "\n"
      << "gather.direct_max = " << c.gatherDirectMax << "\n";
  const std::pair<const char*, const CrossMemoryRange*> ranges[] = {
      {"allreduce", &c.allreduceCma},
      {"broadcast", &c.broadcastCma},
      {"allgather", &c.allgatherCma},
      {"reduce_scatter", &c.reduceScatterCma}};
  for (const auto& [op, range] : ranges) {
    if (range->max == 0) continue;  // never: the default
    out << op << ".cma_min = " << range->min << "\n" << op << ".cma_max = " << range->max << "\n";
  }
  const std::pair<const char*, const SizeRules*> rules[] = {
      {"allreduce", &c.allreduceRules},
      {"broadcast", &c.broadcastRules},
      {"allgather", &c.allgatherRules},
      {"reduce_scatter", &c.reduceScatterRules}};
  for (const auto& [op, list] : rules) {
    if (list->empty()) continue;
    out << op << ".rules =";
    for (const SizeRule& r : *list) out << " " << r.from << ":" << algorithmName(r.algorithm);
    out << "\n";
  }
  return out.str();
}

}  // namespace loom::comm
