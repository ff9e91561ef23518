// Results of a sweep and their three renderings: the nccl-tests table on stdout, nccl-tests'
// JSON (--json) and a flat CSV (--csv) that loom-bench-compare and the plot read back.
//
// Table layout (nccl-tests, one line per size):
//   size count type redop root | time algbw busbw #wrong (out-of-place) | same (in-place)
// followed by loom-bench's own columns, which scripts that split nccl-tests lines on
// whitespace and read the first 13 fields never see:
//   | p50 p99 skew (out-of-place) | p50 p99 skew (in-place)
// time is the mean time of one iteration on the slowest rank (µs); p50/p99 are percentiles
// over iterations of the per-iteration maximum over ranks; skew is the spread between the
// slowest and the fastest rank's mean time. #wrong is N/A when the run did not check (-c 0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/bench/types.h"

namespace loom::bench {

// Sizes below this get RunInfo::smallIters / SweepOptions::smallIters timed iterations (the
// tables' latency rows: they print time below 64 KiB and busbw from it).
constexpr size_t kSmallIterBytes = size_t{64} << 10;

// The timed iterations of a size of `bytes`: smallIters below kSmallIterBytes when set, else
// iters.
inline int timedIters(size_t bytes, int iters, int smallIters) {
  return bytes < kSmallIterBytes && smallIters > 0 ? smallIters : iters;
}

struct Measure {
  double timeUs = 0;
  double algBw = 0;    // GB/s
  double busBw = 0;    // GB/s
  int64_t wrong = -1;  // wrong elements summed over ranks; -1 when not checked
  double p50Us = 0;
  double p99Us = 0;
  double skewUs = 0;
};

struct Row {
  Op op = Op::kAllReduce;
  size_t bytes = 0;
  size_t count = 0;
  std::string type;   // "float"
  std::string redop;  // "sum", or "none" for ops without a reduction
  int root = -1;      // -1 for ops without a root
  Measure outOfPlace;
  Measure inPlace;
};

// What the header lines and the JSON config say about the run.
struct RunInfo {
  std::string program = "loom-bench";
  std::string series;  // "loom tcp", "gloo ring", "mpi shm": one line of the plot
  std::string op;
  int worldSize = 1;
  size_t minBytes = 0;
  size_t maxBytes = 0;
  size_t stepFactor = 2;
  int warmupIters = 0;
  int iters = 0;
  int smallIters = 0;  // timed iterations below kSmallIterBytes (0: iters)
  int check = 0;
  std::vector<std::string> args;       // argv
  std::vector<std::string> rankLines;  // one per rank: "Rank  0 Pid  1234 on host ..."
};

struct Summary {
  int64_t wrong = 0;    // total over all rows (0 when unchecked)
  double avgBusBw = 0;  // mean busbw over every measured column (both placements)
  bool checked = false;
};

Summary summarize(const std::vector<Row>& rows);

// nccl-tests' number format: fits `value` in `width` characters, dropping decimals first.
std::string formatNumber(double value, int width);

std::string headerText(const RunInfo& info);  // "# ..." lines, ending with the column header
std::string rowText(const Row& row);          // one line, newline-terminated
std::string footerText(const RunInfo& info, const Summary& summary);

// nccl-tests' JSON document (version, start_time, args, config, results[], out_of_bounds,
// average_bus_bandwidth) with loom-bench's extras (series, op, world_size, and p50_us, p99_us,
// skew_us inside out_of_place / in_place).
nlohmann::json toJson(const RunInfo& info, const std::vector<Row>& rows, const Summary& summary);

// CSV: a header line then one line per row. Several files can be concatenated (header lines
// are skipped when read back).
std::string csvHeader();
std::string toCsv(const RunInfo& info, const std::vector<Row>& rows, bool withHeader = true);

struct CsvRecord {
  std::string series;
  std::string op;
  int worldSize = 0;
  Row row;
};
// Throws InvalidArgumentError naming the file and line when a line does not parse.
std::vector<CsvRecord> parseCsv(const std::string& text, const std::string& name = "csv");

// Writes `text` to `path`, throwing IoError with the path and errno text on failure.
void writeFile(const std::string& path, const std::string& text);
std::string readFile(const std::string& path);

}  // namespace loom::bench
