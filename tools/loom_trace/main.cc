// loom-trace merge -o OUT DIR_OR_FILE...: joins the per-rank traces that LOOM_TRACE=DIR writes
// (loom-trace-rank<r>.json, Chrome trace-event JSON, one process per rank) into one file that
// ui.perfetto.dev and chrome://tracing open, ranks as processes in rank order.
//
// A trace is either one JSON object {"traceEvents": [...]} or, as LOOM_TRACE writes it, a JSON
// array with one event per line; an array whose process died before closing it (no "]", a
// last line cut short) is read up to its last whole line and said so on stderr, not an error.
//
// Every input is checked: it must be a JSON object with a "traceEvents" array whose events have
// a name, a phase and integer pid / tid, and (except metadata) a numeric ts. A bad file is
// reported with its name and what is wrong, and the exit status is 1 (the others are merged);
// 2 on a usage error.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loom/cli/checks.h"

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

// An array trace read line by line: "[", then one event per line (each but the last ending in
// ","), then "]". Sets `unterminated` when the array has no end (the process died); a last line
// cut short is then dropped. Throws std::runtime_error naming the line that is not an event.
json readLines(const std::string& text, bool& unterminated, size_t& cutShort) {
  json events = json::array();
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // "["
  size_t number = 1;
  std::vector<std::pair<size_t, std::string>> lines;
  bool closed = false;
  while (std::getline(in, line)) {
    ++number;
    const size_t end = line.find_last_not_of(" \t\r");
    if (end == std::string::npos) continue;
    line.resize(end + 1);
    if (line == "]") {
      closed = true;
      break;
    }
    lines.emplace_back(number, line);
  }
  unterminated = !closed;
  cutShort = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string& l = lines[i].second;
    if (l.back() == ',') l.pop_back();
    try {
      events.push_back(json::parse(l));
    } catch (const json::parse_error&) {
      if (unterminated && i + 1 == lines.size()) {
        cutShort = 1;  // the write the process died in
        break;
      }
      throw std::runtime_error("line " + std::to_string(lines[i].first) + " is not a JSON event");
    }
  }
  return json{{"traceEvents", std::move(events)}};
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
      std::stringstream buffer;
      buffer << in.rdbuf();
      const std::string text = buffer.str();
      const size_t first = text.find_first_not_of(" \t\r\n");
      json doc;
      if (first != std::string::npos && text[first] == '[') {
        bool unterminated = false;
        size_t cutShort = 0;
        doc = readLines(text.substr(first), unterminated, cutShort);
        if (unterminated) {
          std::cerr << "loom-trace: " << file << ": unterminated (its process ended without "
                    << "closing the trace): read " << doc["traceEvents"].size() << " event(s)"
                    << (cutShort ? ", dropped a last line cut short" : "") << "\n";
        }
      } else {
        try {
          doc = json::parse(text);
        } catch (const json::parse_error& e) {
          throw std::runtime_error(std::string("invalid JSON at byte ") + std::to_string(e.byte) +
                                   " (truncated?)");
        }
      }
      check(doc);
      for (const json& e : doc["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "trace_end" && e.contains("args") &&
            e["args"].contains("dropped") && e["args"]["dropped"].is_number_unsigned()) {
          dropped += e["args"]["dropped"].get<uint64_t>();
        }
      }
      for (json& e : doc["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "trace_end") continue;  // its count is in "dropped"
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
  if (bad && pids.empty()) {
    // Nothing read (a mistyped path, say): an earlier output stays as it was.
    std::cerr << "loom-trace: no trace could be read; " << outPath << " is not written\n";
    return 1;
  }
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"producer", "loom-trace merge"}, {"dropped", dropped}}}};
  // Written beside it and renamed: a failed write leaves an earlier output whole.
  const std::string partial = outPath + ".partial";
  {
    std::ofstream o(partial);
    o << out.dump() << "\n";
    o.close();
    if (!o || std::rename(partial.c_str(), outPath.c_str()) != 0) {
      std::remove(partial.c_str());
      std::cerr << "loom-trace: could not write " << outPath << "\n";
      return 1;
    }
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
    return loom::cli::exitFor(app, e, "loom-trace");
  }
  return merge(out, paths);
}
