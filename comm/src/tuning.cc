#include "loom/comm/tuning.h"

#include <fstream>
#include <sstream>

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

}  // namespace

std::string topologyKey(int worldSize, int ranksPerHost, const std::string& transport) {
  return detail::str("world=", worldSize, " per_host=", ranksPerHost, " transport=", transport);
}

std::optional<Crossovers> loadTuning(const std::string& path, const std::string& key,
                                     std::string& why) {
  std::ifstream in(path);
  if (!in) {
    why = detail::str("cannot read tuning file ", path, ": ", detail::errnoText(errno));
    return std::nullopt;
  }
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
                        "broadcast.tree_max, gather.direct_max) inside a [topology] section");
      return std::nullopt;
    }
    if (inKey) {
      *field = bytes;
      ++fields;
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
  return out.str();
}

}  // namespace loom::comm
