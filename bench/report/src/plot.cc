#include "loom/bench/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "loom/bench/sizes.h"

namespace loom::bench {
namespace {

// Mostly the colour-blind friendly Okabe-Ito palette, a strong red first (the lead series, drawn
// thicker), then greys.
constexpr const char* kColors[] = {"#D55E00", "#0072B2", "#009E73", "#CC79A7", "#8C564B",
                                   "#56B4E9", "#000000", "#F0E442", "#999999", "#666666"};

std::string escapeXml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string label(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

double niceCeil(double value) {
  if (!(value > 0)) return 1.0;
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  for (double step : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (step * power >= value * (1 - 1e-12)) return step * power;
  }
  return 10 * power;
}

std::string plotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const double left = 80, right = 230, top = 50, bottom = 70;
  const double plotW = options.width - left - right;
  const double plotH = options.height - top - bottom;

  double minX = std::numeric_limits<double>::max(), maxX = 0, maxY = 0;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      if (x < 1) continue;
      minX = std::min(minX, x);
      maxX = std::max(maxX, x);
      if (std::isfinite(y)) maxY = std::max(maxY, y);
    }
  }
  if (maxX == 0) {
    minX = 1;
    maxX = 1024;
  }
  double lo = std::floor(std::log2(minX));
  double hi = std::ceil(std::log2(maxX));
  if (hi <= lo) hi = lo + 1;
  const double yTop = niceCeil(maxY > 0 ? maxY * 1.05 : 1.0);
  auto px = [&](double x) { return left + (std::log2(x) - lo) / (hi - lo) * plotW; };
  auto py = [&](double y) { return top + plotH - std::clamp(y / yTop, 0.0, 1.0) * plotH; };

  std::string svg;
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(options.width) +
         "\" height=\"" + std::to_string(options.height) +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(left + plotW / 2) +
         "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" + escapeXml(options.title) +
         "</text>\n";

  // Grid and y ticks: five steps of yTop / 5.
  for (int i = 0; i <= 5; ++i) {
    const double v = yTop * i / 5;
    const double y = py(v);
    svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + plotW) +
           "\" y2=\"" + num(y) + "\" stroke=\"#dddddd\"/>\n";
    svg += "<text x=\"" + num(left - 8) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
           label(v) + "</text>\n";
  }
  // x ticks: every power of two, labelled at most ~12 times.
  const int span = static_cast<int>(hi - lo);
  const int every = std::max(1, (span + 11) / 12);
  for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); ++e) {
    const double x = left + (e - lo) / (hi - lo) * plotW;
    const bool labelled = (e - static_cast<int>(lo)) % every == 0;
    svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x) + "\" y2=\"" +
           num(top + plotH) + "\" stroke=\"" + (labelled ? "#dddddd" : "#f2f2f2") + "\"/>\n";
    if (labelled) {
      svg += "<text x=\"" + num(x) + "\" y=\"" + num(top + plotH + 18) +
             "\" text-anchor=\"middle\">" +
             escapeXml(formatSize(static_cast<size_t>(std::ldexp(1.0, e)))) + "</text>\n";
    }
  }
  svg += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(plotW) +
         "\" height=\"" + num(plotH) + "\" fill=\"none\" stroke=\"black\"/>\n";
  svg += "<text x=\"" + num(left + plotW / 2) + "\" y=\"" + num(options.height - 20.0) +
         "\" text-anchor=\"middle\">" + escapeXml(options.xLabel) + "</text>\n";
  svg += "<text transform=\"translate(22," + num(top + plotH / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + escapeXml(options.yLabel) + "</text>\n";

  for (size_t s = 0; s < series.size(); ++s) {
    const char* color = kColors[s % std::size(kColors)];
    std::vector<std::pair<double, double>> pts;
    for (const auto& [x, y] : series[s].points) {
      if (x >= 1 && std::isfinite(y)) pts.emplace_back(x, y);
    }
    std::sort(pts.begin(), pts.end());
    std::string points;
    for (const auto& [x, y] : pts) points += num(px(x)) + "," + num(py(y)) + " ";
    if (!points.empty()) {
      svg += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"" +
             (s == 0 ? "3" : "1.5") + "\" points=\"" + points + "\"/>\n";
    }
    for (const auto& [x, y] : pts) {
      svg += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3\" fill=\"" + color +
             "\"><title>" + escapeXml(series[s].name) + ": " +
             escapeXml(formatSize(static_cast<size_t>(x))) + ", " + label(y) +
             " GB/s</title></circle>\n";
    }
    const double ly = top + 10 + 20.0 * static_cast<double>(s);
    const double lx = left + plotW + 20;
    svg += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(lx + 24) + "\" y2=\"" +
           num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + num(lx + 30) + "\" y=\"" + num(ly + 4) + "\">" +
           escapeXml(series[s].name) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace loom::bench
