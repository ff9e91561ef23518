#include "loom/bench/report.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "loom/common/error.h"

namespace loom::bench {
namespace {

std::string printf1(const char* format, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), format, args...);
  return buf;
}

std::string wrongText(int64_t wrong) {
  return wrong < 0 ? std::string("   N/A") : printf1("%6lld", static_cast<long long>(wrong));
}

std::string measureText(const Measure& m) {
  return "  " + formatNumber(m.timeUs, 7) + "  " + formatNumber(m.algBw, 6) + "  " +
         formatNumber(m.busBw, 6) + "  " + wrongText(m.wrong);
}

std::string statsText(const Measure& m) {
  return "  " + formatNumber(m.p50Us, 7) + "  " + formatNumber(m.p99Us, 7) + "  " +
         formatNumber(m.skewUs, 7);
}

std::string nowText() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

nlohmann::json measureJson(const Measure& m, bool checked) {
  nlohmann::json j;
  j["time"] = m.timeUs;
  j["alg_bw"] = m.algBw;
  j["bus_bw"] = m.busBw;
  j["nwrong"] = checked ? nlohmann::json(static_cast<double>(m.wrong)) : nlohmann::json();
  j["p50_us"] = m.p50Us;
  j["p99_us"] = m.p99Us;
  j["skew_us"] = m.skewUs;
  return j;
}

std::string csvField(std::string text) {
  for (char& c : text) {
    if (c == ',' || c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::vector<std::string> splitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

}  // namespace

Summary summarize(const std::vector<Row>& rows) {
  Summary summary;
  double total = 0;
  int n = 0;
  for (const Row& row : rows) {
    for (const Measure* m : {&row.outOfPlace, &row.inPlace}) {
      if (m->wrong >= 0) {
        summary.checked = true;
        summary.wrong += m->wrong;
      }
      if (opMovesData(row.op)) {
        total += m->busBw;
        ++n;
      }
    }
  }
  summary.avgBusBw = n > 0 ? total / n : 0.0;
  return summary;
}

std::string formatNumber(double value, int width) {
  int digits = 0;  // digits before the decimal point (0 for values below 1)
  for (double bound = 1; std::fabs(value) >= bound && digits < 30; bound *= 10) ++digits;
  if (digits < width - 2) return printf1("%*.2f", width, value);
  if (digits < width - 1) return printf1("%*.1f", width, value);
  if (digits < width + 1) return printf1("%*.0f", width, value);
  return printf1("%*.1e", width, value);
}

std::string headerText(const RunInfo& info) {
  std::string out;
  out += "# " + info.program + ": " + info.op + ", " + info.series + ", world size " +
         std::to_string(info.worldSize) + "\n";
  out += printf1(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d "
      "iters: %d agg iters: 1 validation: %d graph: 0\n",
      info.minBytes, info.maxBytes, info.stepFactor, info.warmupIters, info.iters, info.check);
  if (info.smallIters > 0 && info.smallIters != info.iters) {
    out += printf1("# iters below %zu bytes: %d\n", kSmallIterBytes, info.smallIters);
  }
  out += "#\n# Using devices\n";
  for (const std::string& line : info.rankLines) out += "#  " + line + "\n";
  out += "#\n";
  out += printf1(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
      "                   out-of-place                in-place\n",
      "", "", "", "", "");
  out += printf1(
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s"
      "  %7s  %7s  %7s  %7s\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
      "busbw", "#wrong", "p50", "p99", "skew", "p50", "p99", "skew");
  out += printf1(
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s"
      "  %7s  %7s  %7s  %7s\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)");
  return out;
}

std::string rowText(const Row& row) {
  std::string out = printf1("%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count, row.type.c_str(),
                            row.redop.c_str(), row.root);
  out += measureText(row.outOfPlace) + measureText(row.inPlace);
  out += statsText(row.outOfPlace) + statsText(row.inPlace);
  out += "\n";
  return out;
}

std::string footerText(const RunInfo& info, const Summary& summary) {
  std::string out;
  out += printf1("# %-20s : %lld %s\n", "Out of bounds values",
                 static_cast<long long>(summary.wrong), summary.wrong ? "FAILED" : "OK");
  out += printf1("# %-20s : %g \n", "Avg bus bandwidth", summary.avgBusBw);
  out += "#\n";
  out += "# Collective test concluded: " + info.op + "\n";
  return out;
}

nlohmann::json toJson(const RunInfo& info, const std::vector<Row>& rows, const Summary& summary) {
  nlohmann::json doc;
  doc["version"] = 2;
  doc["start_time"] = nowText();
  doc["args"] = info.args;
  doc["program"] = info.program;
  doc["series"] = info.series;
  doc["op"] = info.op;
  doc["world_size"] = info.worldSize;
  nlohmann::json config;
  config["nthreads"] = 1;
  config["ngpus"] = 1;
  config["minimum_bytes"] = info.minBytes;
  config["maximum_bytes"] = info.maxBytes;
  config["step_factor"] = info.stepFactor;
  config["warmup_iters"] = info.warmupIters;
  config["iterations"] = info.iters;
  config["aggregated_iterations"] = 1;
  config["validation"] = info.check;
  config["graph"] = 0;
  config["devices"] = info.rankLines;
  doc["config"] = config;
  nlohmann::json results = nlohmann::json::array();
  for (const Row& row : rows) {
    nlohmann::json r;
    r["size"] = row.bytes;
    r["count"] = row.count;
    r["type"] = row.type;
    r["redop"] = row.redop;
    r["root"] = std::to_string(row.root);
    r["out_of_place"] = measureJson(row.outOfPlace, row.outOfPlace.wrong >= 0);
    r["in_place"] = measureJson(row.inPlace, row.inPlace.wrong >= 0);
    r["actual_iterations"] = timedIters(row.bytes, info.iters, info.smallIters);
    r["experiment_name"] = info.op;
    results.push_back(r);
  }
  doc["results"] = results;
  doc["out_of_bounds"] = {{"count", summary.wrong}, {"okay", summary.wrong == 0}};
  doc["average_bus_bandwidth"] = {{"bandwidth", summary.avgBusBw}, {"okay", "unchecked"}};
  doc["end_time"] = nowText();
  return doc;
}

std::string csvHeader() {
  return "series,op,world_size,size,count,type,redop,root,"
         "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong,"
         "oop_p50_us,oop_p99_us,oop_skew_us,ip_p50_us,ip_p99_us,ip_skew_us\n";
}

std::string toCsv(const RunInfo& info, const std::vector<Row>& rows, bool withHeader) {
  std::string out = withHeader ? csvHeader() : std::string();
  for (const Row& row : rows) {
    const Measure& o = row.outOfPlace;
    const Measure& i = row.inPlace;
    out += csvField(info.series) + "," + csvField(opName(row.op)) + "," +
           std::to_string(info.worldSize) + "," + std::to_string(row.bytes) + "," +
           std::to_string(row.count) + "," + csvField(row.type) + "," + csvField(row.redop) + "," +
           std::to_string(row.root);
    out += printf1(",%.3f,%.6f,%.6f,%lld,%.3f,%.6f,%.6f,%lld", o.timeUs, o.algBw, o.busBw,
                   static_cast<long long>(o.wrong), i.timeUs, i.algBw, i.busBw,
                   static_cast<long long>(i.wrong));
    out += printf1(",%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", o.p50Us, o.p99Us, o.skewUs, i.p50Us, i.p99Us,
                   i.skewUs);
  }
  return out;
}

std::vector<CsvRecord> parseCsv(const std::string& text, const std::string& name) {
  std::vector<CsvRecord> records;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("series,", 0) == 0 || line[0] == '#') continue;
    const std::vector<std::string> f = splitCsv(line);
    if (f.size() != 22) {
      LOOM_THROW(InvalidArgumentError, name, ":", lineNo, ": expected 22 comma-separated fields (",
                 csvHeader().substr(0, csvHeader().size() - 1), "), got ", f.size());
    }
    try {
      CsvRecord r;
      r.series = f[0];
      r.op = f[1];
      r.row.op = parseOp(f[1]);
      r.worldSize = std::stoi(f[2]);
      r.row.bytes = std::stoull(f[3]);
      r.row.count = std::stoull(f[4]);
      r.row.type = f[5];
      r.row.redop = f[6];
      r.row.root = std::stoi(f[7]);
      Measure* ms[] = {&r.row.outOfPlace, &r.row.inPlace};
      for (int p = 0; p < 2; ++p) {
        ms[p]->timeUs = std::stod(f[8 + 4 * p]);
        ms[p]->algBw = std::stod(f[9 + 4 * p]);
        ms[p]->busBw = std::stod(f[10 + 4 * p]);
        ms[p]->wrong = std::stoll(f[11 + 4 * p]);
        ms[p]->p50Us = std::stod(f[16 + 3 * p]);
        ms[p]->p99Us = std::stod(f[17 + 3 * p]);
        ms[p]->skewUs = std::stod(f[18 + 3 * p]);
      }
      records.push_back(std::move(r));
    } catch (const std::logic_error& e) {  // std::invalid_argument / out_of_range from sto*
      LOOM_THROW(InvalidArgumentError, name, ":", lineNo, ": bad number in '", line, "' (",
                 e.what(), ")");
    }
  }
  return records;
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    LOOM_THROW(IoError, "cannot open '", path, "' for writing: ", std::strerror(errno));
  }
  out << text;
  out.flush();
  if (!out) LOOM_THROW(IoError, "cannot write '", path, "': ", std::strerror(errno));
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LOOM_THROW(IoError, "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace loom::bench
