// loom-trace merge -o OUT DIR_OR_FILE...: joins the per-rank traces that LOOM_TRACE=DIR writes
// (loom-trace-rank<r>.json, Chrome trace-event JSON, one process per rank) into one file that
// ui.perfetto.dev and chrome://tracing open, ranks as processes in rank order.
//
// Every input is checked: it must be a JSON object with a "traceEvents" array whose events have
// a name, a phase and integer pid / tid, and (except metadata) a numeric ts. A bad file is
// reported with its name and what is wrong, and the exit status is 1 (the others are merged);
// 2 on a usage error.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The files named, directories expanded to their loom-trace-*.json, sorted.
std::vector<std::string> inputs(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(p)) {
        const std::string name = e.path().filename().string();
        if (name.starts_with("loom-trace-") && name.ends_with(".json")) {
          found.push_back(e.path().string());
        }
      }
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      out.push_back(p);
    }
  }
  return out;
}

// Throws std::runtime_error naming what is wrong with `doc`.
void check(const json& doc) {
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    throw std::runtime_error("not a trace: expected an object with a \"traceEvents\" array");
  }
  size_t i = 0;
  for (const json& e : doc["traceEvents"]) {
    const std::string at = "traceEvents[" + std::to_string(i++) + "]";
    if (!e.is_object()) throw std::runtime_error(at + ": not an object");
    if (!e.contains("name") || !e["name"].is_string()) {
      throw std::runtime_error(at + ": no string \"name\"");
    }
    if (!e.contains("ph") || !e["ph"].is_string() || e["ph"].get<std::string>().size() != 1) {
      throw std::runtime_error(at + ": no one-letter \"ph\"");
    }
    for (const char* id : {"pid", "tid"}) {
      if (!e.contains(id) || !e[id].is_number_integer()) {
        throw std::runtime_error(at + ": no integer \"" + id + "\"");
      }
    }
    if (e["ph"] != "M" && (!e.contains("ts") || !e["ts"].is_number())) {
      throw std::runtime_error(at + ": no numeric \"ts\"");
    }
    if (e["ph"] == "X" && (!e.contains("dur") || !e["dur"].is_number() || e["dur"] < 0)) {
      throw std::runtime_error(at + ": a complete event (\"X\") needs \"dur\" >= 0");
    }
  }
}

int merge(const std::string& outPath, const std::vector<std::string>& paths) {
  json events = json::array();
  std::set<int64_t> pids;
  bool bad = false;
  uint64_t dropped = 0;
  const std::vector<std::string> files = inputs(paths);
  if (files.empty()) {
    std::cerr << "loom-trace: no loom-trace-*.json among the paths given\n";
    return 1;
  }
  for (const std::string& file : files) {
    try {
      std::ifstream in(file);
      if (!in) throw std::runtime_error("cannot be opened");
      json doc;
      try {
        doc = json::parse(in);
      } catch (const json::parse_error& e) {
        throw std::runtime_error(std::string("invalid JSON at byte ") + std::to_string(e.byte) +
                                 " (truncated?)");
      }
      check(doc);
      for (json& e : doc["traceEvents"]) {
        const int64_t pid = e["pid"].get<int64_t>();
        if (e["ph"] == "M" && e["name"] == "process_name" && pids.count(pid)) {
          throw std::runtime_error("a second trace of process " + std::to_string(pid) +
                                   " (rank): one file per rank");
        }
        events.push_back(std::move(e));
      }
      for (const json& e : events) pids.insert(e["pid"].get<int64_t>());
      if (doc.contains("otherData") && doc["otherData"].contains("dropped")) {
        dropped += doc["otherData"]["dropped"].get<uint64_t>();
      }
    } catch (const std::exception& e) {
      std::cerr << "loom-trace: " << file << ": " << e.what() << "\n";
      bad = true;
    }
  }
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"producer", "loom-trace merge"}, {"dropped", dropped}}}};
  std::ofstream o(outPath);
  o << out.dump() << "\n";
  if (!o) {
    std::cerr << "loom-trace: could not write " << outPath << "\n";
    return 1;
  }
  std::cout << "loom-trace: merged " << files.size() << " file(s), " << pids.size()
            << " rank(s) into " << outPath << "\n";
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-trace: tools for LOOM_TRACE timelines"};
  app.require_subcommand(1);
  CLI::App* m = app.add_subcommand("merge", "merge per-rank traces into one Perfetto file");
  std::string out;
  std::vector<std::string> paths;
  m->add_option("-o,--output", out, "the merged trace")->required();
  m->add_option("paths", paths, "directories (their loom-trace-*.json) and files")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return merge(out, paths);
}
