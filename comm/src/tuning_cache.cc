// The tuning in force (loom/comm/tuning_cache.h): this machine's facts, the built-in table of a
// topology, the per-host JSON cache that loom-bench --tune writes, and the choice between them.
#include "loom/comm/tuning_cache.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/settings.h"

#ifndef LOOM_VERSION_STRING
#define LOOM_VERSION_STRING "unknown"
#endif

namespace loom::comm {

namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "loom-tuning-cache";

std::string firstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "1024K" -> 1 MiB; 0 when unreadable.
size_t parseCacheSize(const std::string& text) {
  size_t value = 0, i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9')
    value = value * 10 + (text[i++] - '0');
  if (i < text.size() && (text[i] == 'K' || text[i] == 'k')) value <<= 10;
  if (i < text.size() && (text[i] == 'M' || text[i] == 'm')) value <<= 20;
  return value;
}

HostFacts readHostFacts() {
  HostFacts f;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      f.cpuModel = line.substr(line.find_first_not_of(" \t", colon + 1) == std::string::npos
                                   ? line.size()
                                   : line.find_first_not_of(" \t", colon + 1));
    }
    break;
  }
  if (f.cpuModel.empty()) f.cpuModel = "unknown";
  if (const long n = ::sysconf(_SC_NPROCESSORS_ONLN); n > 0) f.onlineCpus = static_cast<int>(n);
  f.cpus = f.onlineCpus;
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    f.cpus = CPU_COUNT(&set);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      int last = cpu;
      while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
      f.cpuMask += detail::str(f.cpuMask.empty() ? "" : ",", cpu);
      if (last > cpu) f.cpuMask += detail::str("-", last);
      cpu = last;
    }
  }
  if (f.cpuMask.empty()) f.cpuMask = detail::str("0-", f.cpus - 1);
  for (int index = 0; index < 16; ++index) {
    const std::string dir = detail::str("/sys/devices/system/cpu/cpu0/cache/index", index, "/");
    const std::string level = firstLine(dir + "level");
    if (level.empty()) break;
    if (firstLine(dir + "type") == "Instruction") continue;
    const size_t bytes = parseCacheSize(firstLine(dir + "size"));
    if (level == "2") f.l2Bytes = bytes;
    if (level == "3") f.l3Bytes = bytes;
  }
  if (f.l2Bytes == 0) {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    f.l2Bytes = l2 > 0 ? static_cast<size_t>(l2) : 0;
  }
  if (f.l3Bytes == 0) {
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    f.l3Bytes = l3 > 0 ? static_cast<size_t>(l3) : 0;
  }
  return f;
}

std::string hex64(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string bytesText(size_t bytes) {
  if (bytes == 0) return "unknown";
  if (bytes % (size_t{1} << 20) == 0) return detail::str(bytes >> 20, " MiB");
  return detail::str(bytes >> 10, " KiB");
}

// The cache at `path` parsed, or null with `why` set.
std::optional<Json> readCache(const std::string& path, std::string& why) {
  std::ifstream in(path);
  if (!in) {
    why = detail::str("cannot read tuning cache ", path, ": ", detail::errnoText(errno));
    return std::nullopt;
  }
  Json doc = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    why = detail::str("tuning cache ", path,
                      " is not a JSON object (malformed; run loom-bench "
                      "--tune again)");
    return std::nullopt;
  }
  return doc;
}

// Why `doc` is not a usable cache of this format and Loom version (and of this host when
// `facts`), or "".
std::string unusable(const Json& doc, const std::string& path, const HostFacts* facts) {
  const auto text = [&](const Json& j, const char* name) {
    return j.contains(name) && j[name].is_string() ? j[name].get<std::string>() : std::string();
  };
  if (text(doc, "format") != kFormat) {
    return detail::str("tuning cache ", path, " has format '", text(doc, "format"), "'; expected '",
                       kFormat, "'");
  }
  if (!doc.contains("version") || !doc["version"].is_number_integer() ||
      doc["version"].get<int>() != kTuningCacheVersion ||
      text(doc, "loom") != LOOM_VERSION_STRING) {
    return detail::str("tuning cache ", path, " is stale: written by format version ",
                       doc.value("version", Json()).dump(), " of Loom '", text(doc, "loom"),
                       "'; expected version ", kTuningCacheVersion, " of Loom '",
                       LOOM_VERSION_STRING, "' (run loom-bench --tune again)");
  }
  if (!doc.contains("sections") || !doc["sections"].is_object()) {
    return detail::str("tuning cache ", path, " has no \"sections\" object (malformed)");
  }
  if (facts != nullptr) {
    const Json host = doc.value("host", Json::object());
    const std::string model = host.is_object() ? text(host, "cpu_model") : "";
    const Json cpus = host.is_object() ? host.value("cpus", Json()) : Json();
    if (model != facts->cpuModel || !cpus.is_number_integer() ||
        cpus.get<int>() != facts->onlineCpus) {
      return detail::str("tuning cache ", path, " is foreign: measured on '", model, "' with ",
                         cpus.dump(), " CPUs; this host is '", facts->cpuModel, "' with ",
                         facts->onlineCpus, " CPUs");
    }
  }
  return {};
}

}  // namespace

int countCpus(const std::vector<std::string>& masks) {
  std::vector<bool> seen;
  for (const std::string& mask : masks) {
    std::istringstream in(mask);
    for (std::string range; std::getline(in, range, ',');) {
      const size_t dash = range.find('-');
      const std::string lo = range.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
          hi.find_first_not_of("0123456789") != std::string::npos || lo.size() > 6 ||
          hi.size() > 6) {
        continue;
      }
      const size_t a = std::stoul(lo), b = std::stoul(hi);
      for (size_t cpu = a; cpu <= b && cpu < (size_t{1} << 16); ++cpu) {
        if (cpu >= seen.size()) seen.resize(cpu + 1);
        seen[cpu] = true;
      }
    }
  }
  return static_cast<int>(std::count(seen.begin(), seen.end(), true));
}

const HostFacts& hostFacts() {
  static const HostFacts facts = readHostFacts();
  return facts;
}

std::string GroupTopology::key() const {
  if (minPerHost == maxPerHost) return topologyKey(worldSize, maxPerHost, transport);
  return detail::str("world=", worldSize, " per_host=", minPerHost, "-", maxPerHost,
                     " transport=", transport);
}

std::string GroupTopology::describe() const {
  return detail::str(worldSize, " ranks on ", hosts, hosts == 1 ? " host" : " hosts", " (",
                     minPerHost == maxPerHost ? std::to_string(maxPerHost)
                                              : detail::str(minPerHost, "-", maxPerHost),
                     " per host), ", minCpus, minCpus == 1 ? " CPU" : " CPUs", ", L2 ",
                     bytesText(minL2Bytes));
}

Crossovers builtinCrossovers(const GroupTopology& t) {
  Crossovers x = builtinCrossovers(t.worldSize);
  const bool oversubscribed = t.maxPerHost > t.minCpus;
  x.allreduceRdMax = oversubscribed ? size_t{256} << 10 : size_t{128} << 10;
  return x;
}

std::string hostFingerprint(const HostFacts& facts) {
  return hex64(fnv1a(detail::str(facts.cpuModel, "|", facts.onlineCpus, "|", kTuningCacheVersion,
                                 "|", LOOM_VERSION_STRING)));
}

std::string tuningCacheDirectory(const std::string& configured) {
  // "off" in any case, as every other settings word ("OFF" was a directory named OFF).
  std::string lower = configured;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "off") return {};
  if (!configured.empty()) return configured;
  if (const auto xdg = settings::text("XDG_CACHE_HOME"); xdg && !xdg->empty()) {
    return *xdg + "/loom";
  }
  if (const auto home = settings::text("HOME"); home && !home->empty()) {
    return *home + "/.cache/loom";
  }
  return {};
}

std::string tuningCachePath(const std::string& directory, const HostFacts& facts) {
  return detail::str(directory, "/tuning-", hostFingerprint(facts), ".json");
}

std::optional<Crossovers> loadTuningCache(const std::string& path, const std::string& key,
                                          const HostFacts& facts, std::string& why,
                                          bool& noSection) {
  noSection = false;
  const std::optional<Json> doc = readCache(path, why);
  if (!doc) return std::nullopt;
  why = unusable(*doc, path, &facts);
  if (!why.empty()) return std::nullopt;
  const Json& sections = (*doc)["sections"];
  if (!sections.contains(key)) {
    noSection = true;
    why = detail::str("tuning cache ", path, " has no section [", key, "]");
    return std::nullopt;
  }
  const Json& section = sections[key];
  if (!section.is_object()) {
    why = detail::str("tuning cache ", path, " section [", key, "] is not an object (malformed)");
    return std::nullopt;
  }
  // The section as a text tuning file, read by the one parser.
  const std::string head = formatTuning(key, Crossovers{}, true);
  std::string text = head.substr(0, head.find('\n') + 1) + "[" + key + "]\n";
  for (const auto& [name, value] : section.items()) {
    if (value.is_number_unsigned() || value.is_number_integer()) {
      text += detail::str(name, " = ", value.dump(), "\n");
    } else if (value.is_string()) {
      text += detail::str(name, " = ", value.get<std::string>(), "\n");
    } else {
      why = detail::str("tuning cache ", path, " section [", key, "]: \"", name, "\" is ",
                        value.dump(), "; expected a byte count or a rules string (malformed)");
      return std::nullopt;
    }
  }
  return parseTuning(text, detail::str(path, " (cache)"), key, why);
}

void writeTuningCache(const std::string& path, const std::string& key, const Crossovers& x,
                      const HostFacts& facts) {
  Json doc;
  std::string ignored;
  if (std::filesystem::exists(path)) {
    if (auto old = readCache(path, ignored); old && unusable(*old, path, &facts).empty()) {
      doc = std::move(*old);
    }
  }
  if (doc.is_null()) {
    doc = Json::object();
    doc["sections"] = Json::object();
  }
  doc["format"] = kFormat;
  doc["version"] = kTuningCacheVersion;
  doc["loom"] = LOOM_VERSION_STRING;
  doc["host"] = {{"fingerprint", hostFingerprint(facts)},
                 {"cpu_model", facts.cpuModel},
                 {"cpus", facts.onlineCpus},
                 {"l2_bytes", facts.l2Bytes},
                 {"l3_bytes", facts.l3Bytes}};
  Json section = Json::object();
  std::istringstream lines(formatTuning(key, x, false));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find(" = ");
    if (line.empty() || line.front() == '[' || eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq), value = line.substr(eq + 3);
    if (value.find_first_not_of("0123456789") == std::string::npos) {
      section[name] = std::stoull(value);
    } else {
      section[name] = value;
    }
  }
  doc["sections"][key] = std::move(section);
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  if (ec) {
    LOOM_THROW(IoError, "cannot create the tuning cache directory ", target.parent_path().string(),
               ": ", ec.message());
  }
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary);
  out << doc.dump(2) << "\n";
  out.close();
  if (!out || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = detail::errnoText(errno);
    std::remove(temporary.c_str());
    LOOM_THROW(IoError, "cannot write tuning cache ", path, ": ", why);
  }
}

std::string tuningDigest(const std::string& key, const Crossovers& x) {
  return hex64(fnv1a(formatTuning(key, x, false)));
}

TuningChoice chooseTuning(const std::string& tuningFile, const std::string& cacheDirectory,
                          const GroupTopology& topology, const HostFacts& facts) {
  TuningChoice choice;
  const std::string key = topology.key();
  choice.crossovers = builtinCrossovers(topology);
  choice.source = "built-in";
  std::string why;
  std::optional<Crossovers> loaded;
  if (!tuningFile.empty()) {
    // A JSON cache named explicitly is taken whatever host measured it.
    std::ifstream in(tuningFile);
    char first = 0;
    in >> first;
    if (first == '{') {
      if (auto doc = readCache(tuningFile, why)) {
        why = unusable(*doc, tuningFile, nullptr);
        HostFacts theirs = facts;
        if (why.empty()) {
          // (value() with a default of another type would throw on a field of the wrong one.)
          const Json host = (*doc).value("host", Json::object());
          if (host.is_object() && host.contains("cpu_model") && host["cpu_model"].is_string()) {
            theirs.cpuModel = host["cpu_model"].get<std::string>();
          }
          if (host.is_object() && host.contains("cpus") && host["cpus"].is_number_integer()) {
            theirs.onlineCpus = host["cpus"].get<int>();
          }
          bool noSection = false;
          loaded = loadTuningCache(tuningFile, key, theirs, why, noSection);
        }
      }
    } else {
      loaded = loadTuning(tuningFile, key, why);
    }
    if (loaded) {
      choice.source = "LOOM_TUNING_FILE " + tuningFile;
    } else {
      choice.source = detail::str("built-in (LOOM_TUNING_FILE unusable: ", why, ")");
      choice.warning = detail::str("LOOM_TUNING_FILE: ", why, "; using the built-in table");
    }
  } else if (!cacheDirectory.empty()) {
    const std::string path = tuningCachePath(cacheDirectory, facts);
    if (std::filesystem::exists(path)) {
      bool noSection = false;
      loaded = loadTuningCache(path, key, facts, why, noSection);
      if (loaded) {
        choice.source = "cache " + path;
      } else if (noSection) {
        choice.source = detail::str("built-in (cache ", path, " has no section [", key, "])");
      } else {
        choice.source = detail::str("built-in (cache unusable: ", why, ")");
        choice.warning = detail::str(why, "; using the built-in table");
      }
    }
  }
  if (loaded) {
    choice.crossovers = std::move(*loaded);
    choice.tuned = true;
  }
  choice.digest = tuningDigest(key, choice.crossovers);
  return choice;
}

}  // namespace loom::comm
