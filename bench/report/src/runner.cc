#include "loom/bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>

#include "loom/bench/data.h"
#include "loom/bench/plot.h"
#include "loom/bench/sizes.h"
#include "loom/cli/checks.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace loom::bench {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, std::max<size_t>(bytes, 64)) != 0) {
    LOOM_THROW(InvalidArgumentError, "cannot allocate ", bytes, " bytes for the benchmark buffers");
  }
  std::memset(p, 0, std::max<size_t>(bytes, 64));
  return Buffer(static_cast<std::byte*>(p));
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto n = static_cast<double>(values.size());
  const auto rank = static_cast<size_t>(std::max(1.0, std::ceil(p / 100.0 * n)));
  return values[std::min(values.size(), rank) - 1];
}

// Buffers on the driver's device, released through it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceMemory* memory, size_t bytes)
      : memory_(memory), data_(static_cast<std::byte*>(memory->allocate(bytes))) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) memory_->release(data_);
  }
  std::byte* get() const { return data_; }

 private:
  DeviceMemory* memory_ = nullptr;
  std::byte* data_ = nullptr;
};

// Everything one placement (out-of-place or in-place) of one row needs.
struct Placement {
  const void* send;
  void* recv;
};

class Sweep {
 public:
  Sweep(Driver& driver, const SweepOptions& options)
      : driver_(driver), opts_(options), rank_(driver.rank()), n_(driver.worldSize()) {
    LOOM_CHECK(!(opts_.touch && device_ && !device_->hostWritable()),
               "--touch rewrites host buffers, but this driver's collectives run on device "
               "memory; run without --touch");
  }

  std::vector<std::string> rankLines();
  Row measureRow(ElemType type, RedOp redop, size_t bytes);

 private:
  // Where the placement's send and recv lie in the buffers starting at sendBase / recvBase.
  Placement placement(const Layout& layout, ElemType type, bool inPlace, std::byte* sendBase,
                      std::byte* recvBase) const;
  void prepare(const Layout& layout, ElemType type, RedOp redop, bool inPlace);
  Measure measure(const Layout& layout, ElemType type, RedOp redop, bool inPlace);

  Driver& driver_;
  const SweepOptions& opts_;
  const int rank_;
  const int n_;
  DeviceMemory* const device_ = driver_.deviceMemory();  // nullptr: host memory
  // The fills and checks; the collectives' buffers too when device_ is null.
  Buffer send_ = allocate(opts_.maxBytes);
  Buffer recv_ = allocate(opts_.maxBytes);
  // The collectives' buffers on device_ (empty without one).
  DeviceBuffer deviceSend_ = device_ ? DeviceBuffer(device_, opts_.maxBytes) : DeviceBuffer();
  DeviceBuffer deviceRecv_ = device_ ? DeviceBuffer(device_, opts_.maxBytes) : DeviceBuffer();
};

// Every rank's pid, host name and device line, gathered as characters in doubles (the one
// exchange every driver has), so that rank 0 prints what each rank really uses.
std::vector<std::string> Sweep::rankLines() {
  constexpr size_t kHostChars = 48;
  constexpr size_t kDeviceChars = 160;
  std::vector<double> mine(1 + kHostChars + kDeviceChars, 0.0);
  mine[0] = static_cast<double>(::getpid());
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  for (size_t i = 0; i < kHostChars && host[i]; ++i) {
    mine[1 + i] = static_cast<unsigned char>(host[i]);
  }
  const std::string device = driver_.deviceLine();
  for (size_t i = 0; i < kDeviceChars && i < device.size(); ++i) {
    mine[1 + kHostChars + i] = static_cast<unsigned char>(device[i]);
  }
  std::vector<double> all(mine.size() * static_cast<size_t>(n_));
  driver_.allgatherDoubles(mine.data(), mine.size(), all.data());
  auto text = [](const double* d, size_t chars) {
    std::string s;
    for (size_t i = 0; i < chars && d[i] != 0; ++i) s += static_cast<char>(d[i]);
    return s;
  };
  std::vector<std::string> lines;
  for (int r = 0; r < n_; ++r) {
    const double* d = all.data() + mine.size() * static_cast<size_t>(r);
    const std::string name = text(d + 1, kHostChars);
    const std::string dev = text(d + 1 + kHostChars, kDeviceChars);
    char line[512];
    std::snprintf(line, sizeof(line), "Rank %2d Group  0 Pid %6d on %10s device %s", r,
                  static_cast<int>(d[0]), name.c_str(), dev.c_str());
    lines.push_back(line);
  }
  return lines;
}

// Bytes of the output buffer a row uses; in place, the input lies inside them too.
size_t spanBytes(const Layout& layout, ElemType type) {
  return std::max(layout.sendCount, layout.recvCount) * elemSize(type);
}

Placement Sweep::placement(const Layout& layout, ElemType type, bool inPlace, std::byte* sendBase,
                           std::byte* recvBase) const {
  const size_t es = elemSize(type);
  if (!inPlace) return {sendBase, recvBase};
  const auto r = static_cast<size_t>(rank_);
  return {recvBase + layout.sendInPlaceOffset * r * es,
          recvBase + layout.recvInPlaceOffset * r * es};
}

void Sweep::prepare(const Layout& layout, ElemType type, RedOp redop, bool inPlace) {
  const size_t es = elemSize(type);
  const Placement p = placement(layout, type, inPlace, send_.get(), recv_.get());
  // Outputs start as all-ones bytes, which no fill produces (data.h).
  const size_t span = spanBytes(layout, type);
  std::memset(recv_.get(), 0xff, span);
  fillInput(opts_.op, redop, type, rank_, n_, const_cast<void*>(p.send), layout.sendCount);
  if (device_ != nullptr) {
    device_->toDevice(deviceRecv_.get(), recv_.get(), span);
    if (!inPlace) device_->toDevice(deviceSend_.get(), send_.get(), layout.sendCount * es);
  }
}

Measure Sweep::measure(const Layout& layout, ElemType type, RedOp redop, bool inPlace) {
  Measure m;
  // The collective runs on `p` (on the device when there is one); the checks read `host`.
  const Placement host = placement(layout, type, inPlace, send_.get(), recv_.get());
  const Placement p =
      device_ ? placement(layout, type, inPlace, deviceSend_.get(), deviceRecv_.get()) : host;
  Call call;
  call.op = opts_.op;
  call.type = type;
  call.redop = redop;
  call.root = opUsesRoot(opts_.op) ? opts_.root : 0;
  call.send = p.send;
  call.recv = p.recv;
  call.count = layout.opCount;
  call.inPlace = inPlace;

  prepare(layout, type, redop, inPlace);
  driver_.barrier();
  // --touch: the input rewritten before each run (zeros: a valid value of every type; or a
  // copy of gradient-like values made once per size).
  const size_t inputBytes = layout.sendCount * elemSize(type);
  std::vector<std::byte> gradients;
  if (opts_.touch && opts_.touchValues == SweepOptions::TouchValues::kGradients) {
    gradients.resize(inputBytes);
    fillGradients(type, rank_, gradients.data(), layout.sendCount);
  }
  const auto touch = [&] {
    if (!opts_.touch) return;
    if (gradients.empty()) {
      std::memset(const_cast<void*>(p.send), 0, inputBytes);
    } else {
      std::memcpy(const_cast<void*>(p.send), gradients.data(), inputBytes);
    }
  };
  for (int i = 0; i < opts_.warmupIters; ++i) {
    touch();
    driver_.run(call);
  }
  driver_.barrier();
  const int iters = timedIters(layout.bytes, opts_.iters, opts_.smallIters);
  std::vector<double> times(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    touch();
    const auto start = std::chrono::steady_clock::now();
    driver_.run(call);
    times[static_cast<size_t>(i)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::vector<double> all(times.size() * static_cast<size_t>(n_));
  driver_.allgatherDoubles(times.data(), times.size(), all.data());
  const TimeStats stats = timeStats(all, n_, iters);
  m.timeUs = stats.meanUs;
  m.p50Us = stats.p50Us;
  m.p99Us = stats.p99Us;
  m.skewUs = stats.skewUs;
  const Bandwidth bw = bandwidth(opts_.op, layout.bytes, stats.meanUs * 1e-6, n_);
  m.algBw = bw.alg;
  m.busBw = bw.bus;

  if (opts_.check > 0) {
    int64_t wrong = 0;
    for (int c = 0; c < opts_.check; ++c) {
      prepare(layout, type, redop, inPlace);
      driver_.barrier();
      driver_.run(call);
      if (device_ != nullptr) {
        device_->toHost(recv_.get(), deviceRecv_.get(), spanBytes(layout, type));
      }
      wrong += countWrong(opts_.op, redop, type, rank_, n_, call.root, layout, host.recv);
    }
    const double mine = static_cast<double>(wrong);
    std::vector<double> each(static_cast<size_t>(n_));
    driver_.allgatherDoubles(&mine, 1, each.data());
    m.wrong = 0;
    for (double w : each) m.wrong += static_cast<int64_t>(w);
  }
  return m;
}

Row Sweep::measureRow(ElemType type, RedOp redop, size_t bytes) {
  const Layout layout = layoutFor(opts_.op, bytes, type, n_);
  Row row;
  row.op = opts_.op;
  row.bytes = layout.bytes;
  row.count = layout.count;
  row.type = elemTypeName(type);
  row.redop = opUsesRedop(opts_.op) ? redOpName(redop) : "none";
  row.root = opUsesRoot(opts_.op) ? opts_.root : -1;
  row.outOfPlace = measure(layout, type, redop, false);
  if (driver_.inPlaceUnsupported(opts_.op).empty()) {
    row.inPlace = measure(layout, type, redop, true);
  }
  return row;
}

}  // namespace

std::string Driver::deviceLine() const {
  return " 0 [cpu] " + series();
}
std::string Driver::unsupported(Op, ElemType, RedOp) const {
  return {};
}
std::string Driver::inPlaceUnsupported(Op) const {
  return {};
}

TimeStats timeStats(const std::vector<double>& times, int worldSize, int iters) {
  TimeStats s;
  if (iters <= 0 || worldSize <= 0) return s;
  const auto k = static_cast<size_t>(iters);
  std::vector<double> perIterMax(k, 0.0);
  double slowest = 0, fastest = std::numeric_limits<double>::max();
  for (int r = 0; r < worldSize; ++r) {
    double sum = 0;
    for (size_t i = 0; i < k; ++i) {
      const double t = times[static_cast<size_t>(r) * k + i];
      sum += t;
      perIterMax[i] = std::max(perIterMax[i], t);
    }
    const double mean = sum / static_cast<double>(k);
    slowest = std::max(slowest, mean);
    fastest = std::min(fastest, mean);
  }
  s.meanUs = slowest * 1e6;
  s.skewUs = (slowest - fastest) * 1e6;
  s.p50Us = percentile(perIterMax, 50) * 1e6;
  s.p99Us = percentile(perIterMax, 99) * 1e6;
  return s;
}

SweepOptions SweepFlags::resolve() const {
  SweepOptions o;
  o.op = parseOp(op);
  o.minBytes = parseSize(minBytes);
  o.maxBytes = parseSize(maxBytes);
  o.stepFactor = stepFactor;
  if (o.op != Op::kBarrier) sweepSizes(o.minBytes, o.maxBytes, o.stepFactor);  // validates
  LOOM_CHECK(iters >= 1, "-n/--iters must be at least 1, got ", iters);
  LOOM_CHECK(smallIters >= 0, "--small-iters must be at least 0 (0: as -n), got ", smallIters);
  LOOM_CHECK(warmupIters >= 0, "-w/--warmup_iters must be at least 0, got ", warmupIters);
  LOOM_CHECK(check >= 0, "-c/--check must be at least 0, got ", check);
  o.iters = iters;
  o.smallIters = smallIters;
  o.warmupIters = warmupIters;
  o.check = check;
  o.touch = touch;
  if (!touchValues.empty()) {
    LOOM_CHECK(touch, "--touch-values ", touchValues,
               " says what --touch writes, but --touch is not given; add --touch");
    LOOM_CHECK(touchValues == "zeros" || touchValues == "gradients",
               "--touch-values must be zeros or gradients, got '", touchValues, "'");
    o.touchValues = touchValues == "gradients" ? SweepOptions::TouchValues::kGradients
                                               : SweepOptions::TouchValues::kZeros;
  }
  o.types = dtype == "all" ? allElemTypes() : std::vector<ElemType>{parseElemType(dtype)};
  o.redops = redop == "all" ? allRedOps() : std::vector<RedOp>{parseRedOp(redop)};
  LOOM_CHECK(root >= 0, "-r/--root must be a rank (>= 0), got ", root);
  o.root = root;
  o.jsonPath = jsonPath;
  o.csvPath = csvPath;
  o.plotPath = plotPath;
  o.series = series;
  return o;
}

void addSweepFlags(CLI::App& app, SweepFlags& f) {
  // A flag given twice takes its last value, as with nccl-tests' getopt, so that a wrapper can
  // put its defaults first and pass the user's flags after them (scripts/run.sh does). This holds
  // for every option added to `app` from here on, the program's own included.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--op", f.op,
                 "collective: all_reduce, broadcast, all_gather, reduce_scatter, reduce, "
                 "gather, scatter, alltoall, barrier, sendrecv")
      ->capture_default_str();
  app.add_option("-b,--minbytes", f.minBytes, "smallest size (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", f.maxBytes, "largest size (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", f.stepFactor, "multiply the size by this between rows (>= 2)")
      ->check(cli::wholeAtLeast(2))
      ->capture_default_str();
  app.add_option("-n,--iters", f.iters, "timed iterations per size")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("--small-iters", f.smallIters,
                 "timed iterations per size below 64 KiB (0: as -n); small sizes take "
                 "microseconds and need more samples for a steady p50")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", f.warmupIters, "untimed iterations before timing")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_option("-c,--check", f.check,
                 "check results this many times per size (0: no check, #wrong shows N/A)")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_flag("--touch", f.touch,
               "rewrite each rank's input before every iteration (untimed), as a training step "
               "rewrites its gradients; without it, in-place loops leave the data in the "
               "caches of the ranks that read it last");
  app.add_option("--touch-values", f.touchValues,
                 "what --touch writes: zeros (default) or gradients (0.01 times a normal draw "
                 "shared by the ranks plus one of each rank's own, as data-parallel gradients; "
                 "for costs that depend on the values, such as LOOM_REPRODUCIBLE=1's; timing "
                 "only, the checks use their own inputs)");
  app.add_option("-d,--datatype", f.dtype,
                 "float, double, half, bfloat16, int8, uint8, int32, int64, or all")
      ->capture_default_str();
  app.add_option("-o,--op_type", f.redop, "reduction: sum, prod, min, max, avg, or all")
      ->capture_default_str();
  app.add_option("-r,--root", f.root, "root rank of broadcast, reduce, gather, scatter")
      ->check(cli::wholeAtLeast(0))
      ->capture_default_str();
  app.add_option("--json", f.jsonPath, "write nccl-tests' JSON document to this file (rank 0)");
  app.add_option("--csv", f.csvPath, "write the rows as CSV to this file (rank 0)");
  app.add_option("--plot", f.plotPath, "draw busbw against size as SVG into this file (rank 0)");
  app.add_option("--series", f.series, "name of this run in the CSV, JSON and plot");
}

int rankFromEnvironment() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const std::optional<long long> v = settings::integer(name)) return static_cast<int>(*v);
  }
  return 0;
}

std::optional<int> parseCommandLine(CLI::App& app, int argc, char** argv,
                                    const std::function<void()>& resolve) {
  int rank = 0;
  try {
    rank = rankFromEnvironment();
  } catch (const InvalidArgumentError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return 2;
  }
  const bool speak = rank == 0;
  try {
    app.parse(argc, argv);
    resolve();
  } catch (const CLI::ParseError& e) {
    if (!speak) return e.get_exit_code() == 0 ? 0 : 2;
    return cli::exitFor(app, e, app.get_name());
  } catch (const InvalidArgumentError& e) {
    if (speak) {
      std::cerr << app.get_name() << ": " << e.what() << "\nRun '" << app.get_name()
                << " --help' for the flags.\n";
    }
    return 2;
  }
  return std::nullopt;
}

int runSweep(Driver& driver, const SweepOptions& options, const std::string& program,
             const std::vector<std::string>& args) {
  const int rank = driver.rank();
  const int n = driver.worldSize();
  const bool printer = rank == 0;
  LOOM_CHECK(!opUsesRoot(options.op) || options.root < n, "-r/--root ", options.root,
             " is not a rank of this world of ", n);
  Sweep sweep(driver, options);

  RunInfo info;
  info.program = program;
  info.series = options.series.empty() ? driver.series() : options.series;
  info.op = opName(options.op);
  info.worldSize = n;
  info.minBytes = options.minBytes;
  info.maxBytes = options.maxBytes;
  info.stepFactor = options.stepFactor;
  info.warmupIters = options.warmupIters;
  info.iters = options.iters;
  info.smallIters = options.smallIters;
  info.check = options.check;
  info.args = args;
  info.rankLines = sweep.rankLines();
  if (printer) {
    std::fputs(headerText(info).c_str(), stdout);
    std::fflush(stdout);
  }

  const std::vector<size_t> sizes =
      options.op == Op::kBarrier
          ? std::vector<size_t>{0}
          : sweepSizes(options.minBytes, options.maxBytes, options.stepFactor);
  const std::vector<RedOp> redops =
      opUsesRedop(options.op) ? options.redops : std::vector<RedOp>{RedOp::kSum};
  const std::vector<ElemType> types =
      options.op == Op::kBarrier ? std::vector<ElemType>{options.types.front()} : options.types;
  if (printer) {
    if (const std::string why = driver.inPlaceUnsupported(options.op); !why.empty()) {
      std::printf("# in-place columns not measured: %s\n", why.c_str());
    }
  }
  std::vector<Row> rows;
  for (ElemType type : types) {
    for (RedOp redop : redops) {
      if (const std::string why = driver.unsupported(options.op, type, redop); !why.empty()) {
        if (printer) {
          std::printf("# skipped %s %s: %s\n", elemTypeName(type),
                      opUsesRedop(options.op) ? redOpName(redop) : "", why.c_str());
        }
        continue;
      }
      for (size_t bytes : sizes) {
        Row row = sweep.measureRow(type, redop, bytes);
        if (printer) {
          std::fputs(rowText(row).c_str(), stdout);
          std::fflush(stdout);
        }
        rows.push_back(std::move(row));
      }
    }
  }
  const Summary summary = summarize(rows);
  if (printer) {
    std::fputs(footerText(info, summary).c_str(), stdout);
    std::fflush(stdout);
    if (!options.jsonPath.empty()) {
      writeFile(options.jsonPath, toJson(info, rows, summary).dump(2) + "\n");
    }
    if (!options.csvPath.empty()) writeFile(options.csvPath, toCsv(info, rows));
    if (!options.plotPath.empty()) {
      PlotSeries series{info.series, {}};
      for (const Row& row : rows) {
        series.points.emplace_back(static_cast<double>(row.bytes), row.outOfPlace.busBw);
      }
      PlotOptions plot;
      plot.title = info.program + " " + info.op + ", world size " + std::to_string(n) +
                   " (out-of-place busbw)";
      writeFile(options.plotPath, plotSvg({series}, plot));
    }
  }
  return summary.wrong > 0 ? 1 : 0;
}

}  // namespace loom::bench
