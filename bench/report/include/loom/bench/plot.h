// A self-contained SVG line chart of bus bandwidth against message size: log2 size axis,
// linear GB/s axis from 0, one polyline with markers per series and a legend, so the plot
// reads without the table. The first series is drawn thicker (the one the others are compared
// with).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::bench {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (size in bytes, busbw in GB/s)
};

struct PlotOptions {
  std::string title = "bus bandwidth";
  std::string yLabel = "busbw (GB/s)";
  std::string xLabel = "message size";
  int width = 960;
  int height = 560;
};

// Points with a size below 1 byte are dropped (log axis). An empty plot still renders axes.
std::string plotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options = {});

// The smallest "nice" number (1, 2, 2.5 or 5 times a power of ten) at or above `value`.
double niceCeil(double value);

}  // namespace loom::bench
