// loom-bench-compare: reads the CSV files written by loom-bench, gloo_bench and mpi_bench
// (--csv) and prints, for every operation and world size, one Markdown table of busbw and time
// per series with the ratio of the baseline series to each other series, and draws one SVG
// plot per operation and world size.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "loom/bench/plot.h"
#include "loom/bench/report.h"
#include "loom/bench/runner.h"
#include "loom/bench/sizes.h"
#include "loom/common/error.h"

namespace loom::bench {
namespace {

struct Key {
  std::string op;
  int worldSize;
  std::string type;
  std::string redop;
  auto operator<=>(const Key&) const = default;
};

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

int compareMain(int argc, char** argv) {
  CLI::App app{
      "Compare loom-bench and peer CSV results: busbw and time per size, ratios of "
      "the baseline series to each other series, and SVG plots.",
      "loom-bench-compare"};
  std::vector<std::string> files;
  std::string baseline;
  std::string plotPrefix;
  bool inPlace = false;
  app.add_option("files", files, "CSV files written with --csv (concatenated ones work too)")
      ->required();
  app.add_option("--baseline", baseline,
                 "series the ratios are relative to (default: the first series read)");
  app.add_option("--plot-prefix", plotPrefix,
                 "write PREFIX<op>_n<world size>.svg for every operation and world size");
  app.add_flag("--in-place", inPlace, "compare the in-place columns instead of out-of-place");
  std::string stat = "mean";
  app.add_option("--stat", stat,
                 "time to compare: mean (nccl-tests' time column) or p50 (the median over "
                 "iterations, robust on a shared machine); busbw follows from it")
      ->check(CLI::IsMember({"mean", "p50"}))
      ->capture_default_str();
  if (auto code = parseCommandLine(app, argc, argv, [] {})) return *code;

  std::vector<std::string> order;  // series in first-seen order
  std::map<Key, std::map<size_t, std::map<std::string, Measure>>> table;
  for (const std::string& file : files) {
    for (const CsvRecord& r : parseCsv(readFile(file), file)) {
      if (std::find(order.begin(), order.end(), r.series) == order.end()) {
        order.push_back(r.series);
      }
      Measure m = inPlace ? r.row.inPlace : r.row.outOfPlace;
      if (stat == "p50" && m.p50Us > 0) {
        // Same size and factor, so busbw scales with the inverse of the time.
        m.busBw *= m.timeUs / m.p50Us;
        m.algBw *= m.timeUs / m.p50Us;
        m.timeUs = m.p50Us;
      }
      table[{r.op, r.worldSize, r.row.type, r.row.redop}][r.row.bytes][r.series] = m;
    }
  }
  if (order.empty()) {
    std::cerr << "loom-bench-compare: no rows in " << files.size() << " file(s)\n";
    return 1;
  }
  if (baseline.empty()) baseline = order.front();
  if (std::find(order.begin(), order.end(), baseline) == order.end()) {
    std::cerr << "loom-bench-compare: baseline series '" << baseline << "' is not in the files\n";
    return 2;
  }
  // The baseline leads every table and is the first (and thickest) line of every plot.
  std::stable_partition(order.begin(), order.end(),
                        [&](const std::string& s) { return s == baseline; });

  for (const auto& [key, bySize] : table) {
    std::set<std::string> present;
    for (const auto& [size, bySeries] : bySize) {
      for (const auto& [series, m] : bySeries) present.insert(series);
    }
    std::vector<std::string> cols;
    for (const std::string& s : order) {
      if (present.count(s)) cols.push_back(s);
    }
    const std::string what = key.redop == "none" ? key.type : key.type + " " + key.redop;
    std::printf("\n### %s, world size %d, %s (%s, %s time; busbw GB/s / time us)\n\n",
                key.op.c_str(), key.worldSize, what.c_str(), inPlace ? "in-place" : "out-of-place",
                stat.c_str());
    std::string head = "| size |";
    std::string rule = "|---:|";
    for (const std::string& s : cols) {
      head += " " + s + " |";
      rule += "---:|";
    }
    const bool haveBase = present.count(baseline) > 0;
    for (const std::string& s : cols) {
      if (haveBase && s != baseline) {
        head += " " + baseline + " / " + s + " |";
        rule += "---:|";
      }
    }
    std::printf("%s\n%s\n", head.c_str(), rule.c_str());
    for (const auto& [size, bySeries] : bySize) {
      std::string line = "| " + formatSize(size) + " |";
      for (const std::string& s : cols) {
        auto it = bySeries.find(s);
        line += it == bySeries.end() ? std::string(" - |")
                                     : " " + fmt("%.3f", it->second.busBw) + " / " +
                                           fmt("%.1f", it->second.timeUs) + " |";
      }
      auto base = bySeries.find(baseline);
      for (const std::string& s : cols) {
        if (!haveBase || s == baseline) continue;
        auto it = bySeries.find(s);
        // No ratio for empty rows (nothing moved; a driver may skip the call) or missing data.
        if (size == 0 || base == bySeries.end() || it == bySeries.end() ||
            base->second.timeUs <= 0 || it->second.timeUs <= 0) {
          line += " - |";
        } else {
          // For one size the busbw ratio equals the inverse time ratio; time also covers barrier.
          line += " " + fmt("%.2fx", it->second.timeUs / base->second.timeUs) + " |";
        }
      }
      std::printf("%s\n", line.c_str());
    }
    if (!plotPrefix.empty() && key.op != "barrier") {
      std::vector<PlotSeries> series;
      for (const std::string& s : cols) {
        PlotSeries ps{s, {}};
        for (const auto& [size, bySeries] : bySize) {
          if (auto it = bySeries.find(s); it != bySeries.end()) {
            ps.points.emplace_back(static_cast<double>(size), it->second.busBw);
          }
        }
        series.push_back(std::move(ps));
      }
      PlotOptions opts;
      opts.title = key.op + ", world size " + std::to_string(key.worldSize) + ", " + key.type +
                   (key.redop == "none" ? "" : " " + key.redop) +
                   (inPlace ? " (in-place busbw, " : " (out-of-place busbw, ") + stat + " time)";
      const std::string path = plotPrefix + key.op + "_n" + std::to_string(key.worldSize) + ".svg";
      writeFile(path, plotSvg(series, opts));
      std::printf("\nplot: %s\n", path.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  try {
    return loom::bench::compareMain(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "loom-bench-compare: " << e.what() << "\n";
    return 1;
  }
}
