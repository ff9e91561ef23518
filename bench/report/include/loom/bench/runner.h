// The sweep every benchmark driver shares (loom-bench, gloo_bench, mpi_bench): the common
// flags, buffer layout and fills, timing, statistics over ranks, checking, and the output
// (table on rank 0's stdout, --json, --csv, --plot). A driver only says how to run one
// collective and how to exchange a few doubles between ranks.
//
// Timing, per size and placement (out-of-place, then in-place): barrier, `warmup` untimed
// iterations, barrier, then `iters` iterations each timed alone on every rank (steady clock,
// the call returns when the collective is complete on that rank; with `touch` every rank
// first rewrites its input, untimed). The per-rank times are
// gathered (untimed); see report.h for how time, p50, p99 and skew are derived. With
// `check` > 0 the inputs are refilled with check data (data.h), the collective runs once more
// and wrong output elements are counted on every rank and summed.
//
// Buffers: host memory unless the driver's collectives need device memory (a DeviceMemory,
// e.g. CUDA buffers for loom-bench --backend nccl). Then the sweep fills and checks host
// mirrors and copies the inputs to the device before each warm-up/timing block and each
// checked run, and the outputs back before counting; the copies are never timed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "loom/bench/report.h"
#include "loom/bench/types.h"

namespace loom::bench {

struct SweepOptions {
  Op op = Op::kAllReduce;
  size_t minBytes = 8;
  size_t maxBytes = size_t{64} << 20;
  size_t stepFactor = 2;
  int iters = 20;
  // Timed iterations per size below kSmallIterBytes; 0: `iters`. Small sizes take
  // microseconds, and a p50 of 20 of them moves by 2-3x between runs on a shared machine; OSU's
  // microbenchmarks likewise time small messages more often than large ones.
  int smallIters = 0;
  int warmupIters = 5;
  int check = 1;
  // Rewrite each rank's input before every iteration (untimed), as a training step rewrites
  // its gradients: the collective then finds the data in the writer's cache, not in the
  // readers' caches where the previous iteration left it (in-place loops otherwise do).
  bool touch = false;
  // What --touch writes: zeros, or gradient-like values (fillGradients, data.h), which matter
  // where the cost depends on the values (the reproducible mode's fast paths).
  enum class TouchValues { kZeros, kGradients };
  TouchValues touchValues = TouchValues::kZeros;
  std::vector<ElemType> types = {ElemType::kFloat};
  std::vector<RedOp> redops = {RedOp::kSum};
  int root = 0;
  std::string jsonPath;
  std::string csvPath;
  std::string plotPath;
  std::string series;  // label for the CSV / plot; the driver's default when empty
};

// The raw flag values as CLI11 fills them; resolve() validates and converts.
struct SweepFlags {
  std::string op = "all_reduce";
  std::string minBytes = "8";
  std::string maxBytes = "64M";
  size_t stepFactor = 2;
  int iters = 20;
  int smallIters = 0;
  int warmupIters = 5;
  int check = 1;
  bool touch = false;
  std::string touchValues;  // empty: zeros
  std::string dtype = "float";
  std::string redop = "sum";
  int root = 0;
  std::string jsonPath;
  std::string csvPath;
  std::string plotPath;
  std::string series;

  // Throws InvalidArgumentError naming the flag and what it expects.
  SweepOptions resolve() const;
};

// Adds -b -e -f -n --small-iters -w -c -d -o -r --op --touch --touch-values --json --csv --plot
// --series to
// `app`.
void addSweepFlags(CLI::App& app, SweepFlags& flags);

// Parses argv into `app`. Returns the exit status to leave with when parsing ended the
// program (0 after --help; 2 after a bad flag, with the error and the usage on stderr), or
// nullopt to go on. `resolve` runs after parsing so that its errors print the usage too.
std::optional<int> parseCommandLine(CLI::App& app, int argc, char** argv,
                                    const std::function<void()>& resolve);

// This process's rank as the launchers (loom-run, torchrun, srun, mpirun) put it in the
// environment, or 0; used to print usage errors once. A value that is not a rank is an
// InvalidArgumentError naming the variable (parseCommandLine then exits with status 2).
int rankFromEnvironment();

struct Call {
  Op op = Op::kAllReduce;
  ElemType type = ElemType::kFloat;
  RedOp redop = RedOp::kSum;
  int root = 0;
  const void* send = nullptr;  // input: sendCount elements (Layout)
  void* recv = nullptr;        // output: recvCount elements
  size_t count = 0;            // Layout::opCount: the count argument of the collective
  bool inPlace = false;        // send and recv follow nccl-tests' in-place layout
};

// Device memory a driver's collectives run on. Every call is synchronous (returns when the
// copy is complete) and throws on failure; release() never throws.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void toDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void toHost(void* dst, const void* src, size_t bytes) = 0;
  // Whether this process may write the memory directly (host memory in another allocator,
  // e.g. Loom windows): --touch rewrites it in place then.
  virtual bool hostWritable() const { return false; }
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  // Default plot label: "loom tcp", "gloo ring", "mpi tcp".
  virtual std::string series() const = 0;
  // This rank's entry of the "# Using devices" lines after "device ": "0 [cpu] loom tcp" by
  // default; "1 [cuda:1] NVIDIA H100 ..." for a GPU.
  virtual std::string deviceLine() const;
  // nullptr (the default): the collectives run on host memory. Owned by the driver.
  virtual DeviceMemory* deviceMemory() { return nullptr; }
  // Empty when the driver can run this combination, else why not ("MPI has no half type").
  virtual std::string unsupported(Op op, ElemType type, RedOp redop) const;
  // Empty when the in-place variant exists, else why not.
  virtual std::string inPlaceUnsupported(Op op) const;
  // Runs one collective; returns when it is complete on this rank.
  virtual void run(const Call& call) = 0;
  virtual void barrier() = 0;
  // out (worldSize * count) = every rank's in (count), in rank order. Not timed.
  virtual void allgatherDoubles(const double* in, size_t count, double* out) = 0;
};

// Runs the sweep; prints the table on rank 0 and writes the files there. Returns the exit
// status: 0, or 1 when any element was wrong on any rank (the same on every rank).
int runSweep(Driver& driver, const SweepOptions& options, const std::string& program,
             const std::vector<std::string>& args);

// Statistics over per-rank, per-iteration times (seconds), laid out rank-major
// (times[r * iters + k]). Returned in microseconds.
struct TimeStats {
  double meanUs = 0;  // slowest rank's mean
  double p50Us = 0;
  double p99Us = 0;
  double skewUs = 0;
};
TimeStats timeStats(const std::vector<double>& times, int worldSize, int iters);

}  // namespace loom::bench
