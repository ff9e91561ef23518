#include <gtest/gtest.h>

#include <sstream>

#include "loom/bench/plot.h"
#include "loom/bench/report.h"
#include "loom/bench/sizes.h"
#include "loom/bench/types.h"
#include "loom/common/error.h"

namespace loom::bench {
namespace {

TEST(Sizes, ParsesSuffixes) {
  EXPECT_EQ(parseSize("8"), 8u);
  EXPECT_EQ(parseSize("1K"), 1024u);
  EXPECT_EQ(parseSize("64k"), 65536u);
  EXPECT_EQ(parseSize("16M"), 16u << 20);
  EXPECT_EQ(parseSize("1G"), 1u << 30);
  EXPECT_EQ(parseSize("2GB"), size_t{2} << 30);
  EXPECT_EQ(parseSize("512b"), 512u);
}

TEST(Sizes, RejectsGarbageWithMessage) {
  for (const char* bad : {"", "M", "1.5M", "-1", "12X", "1KK", "99999999999999999999"}) {
    try {
      parseSize(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("size"), std::string::npos) << e.what();
    }
  }
}

TEST(Sizes, SweepIsGeometricAndInclusive) {
  EXPECT_EQ(sweepSizes(8, 64, 2), (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(sweepSizes(8, 100, 4), (std::vector<size_t>{8, 32}));
  EXPECT_EQ(sweepSizes(5, 5, 2), (std::vector<size_t>{5}));
  EXPECT_EQ(sweepSizes(1, SIZE_MAX, 1u << 31).size(), 3u);  // stops before overflowing
  EXPECT_THROW(sweepSizes(0, 8, 2), InvalidArgumentError);
  EXPECT_THROW(sweepSizes(16, 8, 2), InvalidArgumentError);
  EXPECT_THROW(sweepSizes(8, 16, 1), InvalidArgumentError);
}

TEST(Sizes, Formats) {
  EXPECT_EQ(formatSize(8), "8 B");
  EXPECT_EQ(formatSize(1024), "1 KiB");
  EXPECT_EQ(formatSize(64u << 20), "64 MiB");
  EXPECT_EQ(formatSize(1536), "1536 B");
}

TEST(Types, NamesRoundTrip) {
  for (Op op : allOps()) EXPECT_EQ(parseOp(opName(op)), op);
  for (ElemType t : allElemTypes()) EXPECT_EQ(parseElemType(elemTypeName(t)), t);
  for (RedOp r : allRedOps()) EXPECT_EQ(parseRedOp(redOpName(r)), r);
  EXPECT_EQ(parseOp("allreduce"), Op::kAllReduce);
  EXPECT_EQ(parseOp("AllGather"), Op::kAllGather);
  EXPECT_EQ(parseElemType("bf16"), ElemType::kBFloat16);
  EXPECT_EQ(parseElemType("fp16"), ElemType::kHalf);
  EXPECT_EQ(parseElemType("float32"), ElemType::kFloat);
  EXPECT_THROW(parseOp("allreduse"), InvalidArgumentError);
  EXPECT_THROW(parseElemType("float128"), InvalidArgumentError);
  EXPECT_THROW(parseRedOp("xor"), InvalidArgumentError);
}

TEST(Types, UnknownOpNamesTheChoices) {
  try {
    parseOp("nope");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter"), std::string::npos);
  }
}

// nccl-tests' conventions: S is the per-rank buffer for all_reduce, the gathered total for
// all_gather, the scattered total for reduce_scatter.
TEST(Types, LayoutsFollowNcclTests) {
  Layout ar = layoutFor(Op::kAllReduce, 1024, ElemType::kFloat, 4);
  EXPECT_EQ(ar.count, 256u);
  EXPECT_EQ(ar.opCount, 256u);
  EXPECT_EQ(ar.sendCount, 256u);
  EXPECT_EQ(ar.recvCount, 256u);

  Layout ag = layoutFor(Op::kAllGather, 1000, ElemType::kFloat, 4);  // 250 elements -> 62 each
  EXPECT_EQ(ag.opCount, 62u);
  EXPECT_EQ(ag.sendCount, 62u);
  EXPECT_EQ(ag.recvCount, 248u);
  EXPECT_EQ(ag.bytes, 992u);
  EXPECT_EQ(ag.sendInPlaceOffset, 62u);
  EXPECT_EQ(ag.recvInPlaceOffset, 0u);

  Layout rs = layoutFor(Op::kReduceScatter, 1024, ElemType::kDouble, 2);
  EXPECT_EQ(rs.opCount, 64u);
  EXPECT_EQ(rs.sendCount, 128u);
  EXPECT_EQ(rs.recvCount, 64u);
  EXPECT_EQ(rs.recvInPlaceOffset, 64u);

  Layout a2a = layoutFor(Op::kAllToAll, 1024, ElemType::kInt8, 3);
  EXPECT_EQ(a2a.opCount, 341u);
  EXPECT_EQ(a2a.sendCount, 1023u);
  EXPECT_EQ(a2a.recvCount, 1023u);

  Layout tiny = layoutFor(Op::kAllGather, 8, ElemType::kDouble, 4);
  EXPECT_EQ(tiny.opCount, 0u);
  EXPECT_EQ(tiny.bytes, 0u);
}

TEST(Types, BusBandwidthFactors) {
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kReduce, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kSendRecv, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBwFactor(Op::kBarrier, 4), 0.0);
  const Bandwidth bw = bandwidth(Op::kAllReduce, 1'000'000'000, 2.0, 4);
  EXPECT_DOUBLE_EQ(bw.alg, 0.5);
  EXPECT_DOUBLE_EQ(bw.bus, 0.75);
}

TEST(Report, NumberFormatFitsWidth) {
  EXPECT_EQ(formatNumber(12.345, 7), "  12.35");
  EXPECT_EQ(formatNumber(0.5, 6), "  0.50");
  EXPECT_EQ(formatNumber(12345.6, 7), "12345.6");
  EXPECT_EQ(formatNumber(1234567.0, 7), "1234567");
  EXPECT_EQ(formatNumber(123456789.0, 7), "1.2e+08");
}

Row sampleRow() {
  Row row;
  row.op = Op::kAllReduce;
  row.bytes = 1048576;
  row.count = 262144;
  row.type = "float";
  row.redop = "sum";
  row.root = -1;
  row.outOfPlace = {500.0, 2.097152, 2.097152, 0, 480.0, 700.0, 12.5};
  row.inPlace = {510.0, 2.056, 2.056, 0, 490.0, 710.0, 13.0};
  return row;
}

std::vector<std::string> fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

// The first 13 fields are nccl-tests' (so its parsers keep working), then p50 p99 skew twice.
TEST(Report, RowHasNcclTestsColumnsFirst) {
  const std::vector<std::string> f = fields(rowText(sampleRow()));
  ASSERT_EQ(f.size(), 19u);
  EXPECT_EQ(f[0], "1048576");
  EXPECT_EQ(f[1], "262144");
  EXPECT_EQ(f[2], "float");
  EXPECT_EQ(f[3], "sum");
  EXPECT_EQ(f[4], "-1");
  EXPECT_EQ(f[5], "500.00");
  EXPECT_EQ(f[6], "2.10");
  EXPECT_EQ(f[7], "2.10");
  EXPECT_EQ(f[8], "0");
  EXPECT_EQ(f[9], "510.00");
  EXPECT_EQ(f[12], "0");
  EXPECT_EQ(f[13], "480.00");
  EXPECT_EQ(f[15], "12.50");
}

TEST(Report, UncheckedRowsSayNA) {
  Row row = sampleRow();
  row.outOfPlace.wrong = row.inPlace.wrong = -1;
  const std::vector<std::string> f = fields(rowText(row));
  EXPECT_EQ(f[8], "N/A");
  EXPECT_EQ(f[12], "N/A");
  EXPECT_FALSE(summarize({row}).checked);
}

TEST(Report, HeaderAndFooterLookLikeNcclTests) {
  RunInfo info;
  info.op = "all_reduce";
  info.series = "loom tcp";
  info.worldSize = 2;
  info.minBytes = 8;
  info.maxBytes = 1024;
  info.iters = 20;
  info.warmupIters = 5;
  info.check = 1;
  info.rankLines = {"Rank  0 Pid 1 on h", "Rank  1 Pid 2 on h"};
  const std::string header = headerText(info);
  EXPECT_NE(header.find("# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup "
                        "iters: 5 iters: 20"),
            std::string::npos);
  EXPECT_EQ(header.find("iters below"), std::string::npos);  // only with --small-iters
  info.smallIters = 200;
  EXPECT_NE(headerText(info).find("# iters below 65536 bytes: 200\n"), std::string::npos);
  EXPECT_NE(header.find("#  Rank  1 Pid 2 on h"), std::string::npos);
  EXPECT_NE(header.find("#wrong"), std::string::npos);
  EXPECT_NE(header.find("algbw"), std::string::npos);

  Row bad = sampleRow();
  bad.inPlace.wrong = 3;
  const Summary s = summarize({sampleRow(), bad});
  EXPECT_EQ(s.wrong, 3);
  EXPECT_NEAR(s.avgBusBw, (2.097152 + 2.056) / 2, 1e-12);
  const std::string footer = footerText(info, s);
  EXPECT_NE(footer.find("# Out of bounds values : 3 FAILED"), std::string::npos) << footer;
  EXPECT_NE(footer.find("# Avg bus bandwidth    : "), std::string::npos) << footer;
  EXPECT_NE(footerText(info, summarize({sampleRow()})).find("Out of bounds values : 0 OK"),
            std::string::npos);
}

TEST(Report, JsonUsesNcclTestsKeys) {
  RunInfo info;
  info.op = "all_reduce";
  info.series = "loom tcp";
  info.worldSize = 2;
  const std::vector<Row> rows = {sampleRow()};
  const nlohmann::json j = toJson(info, rows, summarize(rows));
  for (const char* key : {"version", "start_time", "args", "config", "results", "out_of_bounds",
                          "average_bus_bandwidth", "end_time"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const nlohmann::json& r = j["results"][0];
  EXPECT_EQ(r["size"], 1048576);
  EXPECT_EQ(r["count"], 262144);
  EXPECT_EQ(r["type"], "float");
  EXPECT_EQ(r["redop"], "sum");
  EXPECT_EQ(r["root"], "-1");
  EXPECT_DOUBLE_EQ(r["out_of_place"]["time"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(r["out_of_place"]["bus_bw"].get<double>(), 2.097152);
  EXPECT_DOUBLE_EQ(r["in_place"]["alg_bw"].get<double>(), 2.056);
  EXPECT_EQ(r["in_place"]["nwrong"], 0);
  EXPECT_DOUBLE_EQ(r["out_of_place"]["p99_us"].get<double>(), 700.0);
  EXPECT_EQ(j["out_of_bounds"]["count"], 0);
  EXPECT_EQ(j["out_of_bounds"]["okay"], true);
  EXPECT_EQ(j["config"]["minimum_bytes"], 0);
  EXPECT_EQ(r["actual_iterations"], 0);  // info.iters
}

// With --small-iters, a row below 64 KiB reports those iterations, a larger one -n's.
TEST(Report, JsonActualIterationsFollowSmallIters) {
  RunInfo info;
  info.op = "all_reduce";
  info.worldSize = 2;
  info.iters = 20;
  info.smallIters = 500;
  Row small = sampleRow();
  small.bytes = 8;
  small.count = 2;
  const std::vector<Row> rows = {small, sampleRow()};
  const nlohmann::json j = toJson(info, rows, summarize(rows));
  EXPECT_EQ(j["results"][0]["actual_iterations"], 500);
  EXPECT_EQ(j["results"][1]["actual_iterations"], 20);
}

TEST(Report, CsvRoundTrips) {
  RunInfo info;
  info.series = "gloo ring, tcp";  // the comma must not break the file
  info.worldSize = 4;
  Row row = sampleRow();
  row.inPlace.wrong = -1;
  const std::string csv = toCsv(info, {row}) + toCsv(info, {row});  // concatenated files
  const std::vector<CsvRecord> back = parseCsv(csv);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].series, "gloo ring  tcp");
  EXPECT_EQ(back[0].op, "all_reduce");
  EXPECT_EQ(back[0].worldSize, 4);
  EXPECT_EQ(back[0].row.bytes, 1048576u);
  EXPECT_EQ(back[0].row.type, "float");
  EXPECT_NEAR(back[0].row.outOfPlace.busBw, 2.097152, 1e-6);
  EXPECT_NEAR(back[0].row.outOfPlace.p99Us, 700.0, 1e-3);
  EXPECT_NEAR(back[0].row.inPlace.skewUs, 13.0, 1e-3);
  EXPECT_EQ(back[0].row.inPlace.wrong, -1);
}

TEST(Report, CsvErrorsNameTheLine) {
  try {
    parseCsv(csvHeader() + "a,b,c\n", "runs.csv");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("runs.csv:2"), std::string::npos) << e.what();
  }
}

TEST(Plot, DrawsOneLinePerSeriesWithLegend) {
  PlotSeries a{"loom tcp", {{8, 0.001}, {1024, 0.1}, {1 << 20, 2.5}}};
  PlotSeries b{"gloo <ring>", {{8, 0.0005}, {1 << 20, 1.2}}};
  const std::string svg = plotSvg({a, b});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++polylines;
  }
  EXPECT_EQ(polylines, 2u);
  EXPECT_NE(svg.find(">loom tcp</text>"), std::string::npos);
  EXPECT_NE(svg.find("gloo &lt;ring&gt;"), std::string::npos);  // escaped
  EXPECT_NE(svg.find(">8 B</text>"), std::string::npos);
  EXPECT_NE(svg.find(">512 KiB</text>"), std::string::npos);
  EXPECT_NE(svg.find(">3</text>"), std::string::npos);  // y axis up to niceCeil(2.5 * 1.05)
}

TEST(Plot, EmptyPlotStillRenders) {
  const std::string svg = plotSvg({});
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Plot, NiceCeil) {
  EXPECT_DOUBLE_EQ(niceCeil(0.7), 1.0);
  EXPECT_DOUBLE_EQ(niceCeil(1.3), 2.0);
  EXPECT_DOUBLE_EQ(niceCeil(2.2), 2.5);
  EXPECT_DOUBLE_EQ(niceCeil(3), 5.0);
  EXPECT_DOUBLE_EQ(niceCeil(7), 10.0);
  EXPECT_DOUBLE_EQ(niceCeil(0), 1.0);
}

}  // namespace
}  // namespace loom::bench
