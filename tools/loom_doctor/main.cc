// loom-doctor: reads the flight record dumps of a job (LOOM_DUMP_DIR, SIGUSR1,
// ProcessGroup::dumpFlightRecord) and prints the same explanation the ranks compute on the
// spot when a collective fails: who never entered which collective and what it does instead,
// mismatched signatures, ranks whose dump is missing.
//
//   loom-doctor DIR_OR_FILE...     every loom-flight-*.json in each directory, and each file
//   loom-doctor --attach tcp://HOST:PORT|file:///PATH --world-size N [--prefix P] [--wait-ms W]
//                                  a live job: every rank's listener dumps its ring through the
//                                  store now (P: the group's store prefix, "default_pg" for
//                                  initProcessGroup, "" for a group made on the raw store)
//
// Dumps are grouped by process group; each group is explained on its own. A file that is not
// a valid dump (truncated, corrupt, another format) is reported with its name and the byte
// offset at fault, and its rank counts as missing.
//
// Exit status: 0 when every dump was read, 1 when some could not be (or none was found), 2 on
// a usage error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/init.h"
#include "loom/store/file_store.h"
#include "loom/store/prefix_store.h"
#include "loom/store/tcp_store.h"

namespace {

namespace fs = std::filesystem;
using loom::diag::RankDump;

struct Group {
  int size = 0;
  std::map<int, RankDump> ranks;
  std::map<int, std::string> files;
};

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw loom::IoError(path + ": cannot open");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// tcp://host:port or file:///path, checked as init methods are (parseInitMethod: a port in
// 1..65535 with nothing after it, an absolute path).
std::shared_ptr<loom::Store> openStore(const std::string& url, std::chrono::milliseconds timeout) {
  if (!url.starts_with("tcp://") && !url.starts_with("file://")) {
    throw loom::InvalidArgumentError("--attach " + url +
                                     ": expected tcp://host:port or file:///path");
  }
  loom::InitMethod method;
  try {
    method = loom::parseInitMethod(url);
  } catch (const loom::InvalidArgumentError& e) {
    throw loom::InvalidArgumentError(std::string("--attach: ") + e.what());
  }
  if (method.kind == loom::InitMethod::Kind::kTcp) {
    loom::TCPStoreOptions options;
    options.timeout = timeout;
    return std::make_shared<loom::TCPStore>(method.host, method.port, options);
  }
  loom::FileStoreOptions options;
  options.timeout = timeout;
  return std::make_shared<loom::FileStore>(method.path, options);
}

int attach(const std::string& url, const std::string& prefix, int size, int waitMs) {
  const std::chrono::milliseconds wait(waitMs);
  std::shared_ptr<loom::Store> store = openStore(url, wait * 2);
  if (!prefix.empty()) store = std::make_shared<loom::PrefixStore>(prefix, store);
  const auto dumps = loom::diag::collectLive(*store, size, wait);
  std::cout << "live job at " << url << (prefix.empty() ? "" : " (group " + prefix + ")") << ", "
            << size << " ranks\n";
  // A rank that does not answer is told by its heartbeat (dead, stopped, ...).
  const std::vector<std::string> why = loom::diag::absentNotes(*store, dumps);
  for (int r = 0; r < size; ++r) {
    if (!dumps[r]) {
      std::cout << "  rank " << r << ": no answer within " << waitMs << " ms"
                << (why[r].empty() ? "" : ": " + why[r]) << "\n";
    }
  }
  std::cout << "  " << loom::diag::explain(dumps, why) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-doctor: explains a hang or failure from Loom flight record dumps"};
  std::vector<std::string> paths;
  std::string attachUrl;
  std::string prefix = "default_pg";
  int worldSize = 0;
  int waitMs = 5000;
  app.add_option("paths", paths, "dump files, or directories holding loom-flight-*.json");
  app.add_option("--attach", attachUrl, "a live job's store: tcp://host:port or file:///path");
  app.add_option("--world-size", worldSize, "with --attach: the group's size")
      ->check(loom::cli::wholeAtLeast(1));
  app.add_option("--prefix", prefix, "with --attach: the group's store prefix")
      ->capture_default_str();
  app.add_option("--wait-ms", waitMs, "with --attach: how long to wait for the ranks' answers")
      ->check(loom::cli::wholeAtLeast(1))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return loom::cli::exitFor(app, e, "loom-doctor");  // a usage error: 2 (docs/diagnostics.md)
  }
  if (!attachUrl.empty()) {
    if (worldSize <= 0 || !paths.empty()) {
      std::cerr << "loom-doctor: --attach takes --world-size and no dump files\n";
      return 2;
    }
    try {
      return attach(attachUrl, prefix, worldSize, waitMs);
    } catch (const loom::InvalidArgumentError& e) {  // a malformed --attach: a usage error
      std::cerr << "loom-doctor: " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << "loom-doctor: " << e.what() << "\n";
      return 1;
    }
  }
  if (paths.empty()) {
    std::cerr << "loom-doctor: give dump files or directories, or --attach\n" << app.help();
    return 2;
  }

  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(p, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("loom-flight-", 0) == 0 && entry.path().extension() == ".json") {
          found.push_back(entry.path().string());
        }
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) std::cerr << "loom-doctor: " << p << ": no loom-flight-*.json in it\n";
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);
    }
  }

  bool bad = files.empty();
  std::map<std::string, Group> groups;
  for (const std::string& file : files) {
    try {
      RankDump d = loom::diag::parseDump(readAll(file), file);
      Group& g = groups[d.group];
      if (g.size != 0 && g.size != d.size) {
        throw loom::InvalidArgumentError(file + ": group size " + std::to_string(d.size) +
                                         " differs from " + std::to_string(g.size) +
                                         " in the other dumps of group '" + d.group + "'");
      }
      if (g.files.count(d.rank)) {
        throw loom::InvalidArgumentError(file + ": a second dump of rank " +
                                         std::to_string(d.rank) + " (the first is " +
                                         g.files[d.rank] + ")");
      }
      g.size = d.size;
      g.files[d.rank] = file;
      g.ranks[d.rank] = std::move(d);
    } catch (const std::exception& e) {
      std::cerr << "loom-doctor: " << e.what() << "\n";
      bad = true;
    }
  }

  for (const auto& [name, g] : groups) {
    std::cout << "group " << (name.empty() ? "default" : name) << " (" << g.size << " ranks, "
              << g.ranks.size() << " dumps)\n";
    std::vector<std::optional<RankDump>> dumps(g.size);
    for (const auto& [rank, d] : g.ranks) dumps[rank] = d;
    for (int r = 0; r < g.size; ++r) {
      if (!dumps[r]) std::cout << "  rank " << r << ": no dump among the files given\n";
    }
    std::cout << "  " << loom::diag::explain(dumps) << "\n";
  }
  return bad ? 1 : 0;
}
