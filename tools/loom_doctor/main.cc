// loom-doctor: reads the flight record dumps of a job (LOOM_DUMP_DIR, SIGUSR1,
// ProcessGroup::dumpFlightRecord) and prints the same explanation the ranks compute on the
// spot when a collective fails: who never entered which collective and what it does instead,
// mismatched signatures, ranks whose dump is missing.
//
//   loom-doctor DIR_OR_FILE...     every loom-flight-*.json in each directory, and each file
//
// Dumps are grouped by process group; each group is explained on its own. A file that is not
// a valid dump (truncated, corrupt, another format) is reported with its name and the byte
// offset at fault, and its rank counts as missing.
//
// Exit status: 0 when every dump was read, 1 when some could not be (or none was found), 2 on
// a usage error.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-doctor: explains a hang or failure from Loom flight record dumps"};
  std::vector<std::string> paths;
  app.add_option("paths", paths, "dump files, or directories holding loom-flight-*.json")
      ->required();
  CLI11_PARSE(app, argc, argv);

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
