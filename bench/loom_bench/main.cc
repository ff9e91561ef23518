// loom-bench: collective microbenchmark over Loom's ProcessGroup, nccl-tests compatible.
//
// Start one process per rank with loom-run (or torchrun, srun, mpirun): the group comes from
// the launcher's environment (process_group/init.h), or from --init-method. Every rank runs
// the sweep of bench/report (runner.h); rank 0 prints the nccl-tests table and writes --json,
// --csv and --plot. The exit status is 0, 1 when any element was wrong on any rank (-c 1), 2
// for a bad flag (or a root outside the world), 3 when the group could not be created or an
// operation failed (also when the backend is not available: --backend nccl without a CUDA
// device or in a build without NCCL, --backend verbs without an RDMA device, --backend mpi in
// a build without MPI).
//
// --backend mpi runs under mpirun (mpirun -np 4 build/bin/loom-bench --backend mpi ...): the
// group is MPI_COMM_WORLD, and without MASTER_ADDR no store is created (init.h).
//
// Memory: host buffers for tcp, verbs and mpi (-R 1: in Loom windows, tcp only). --backend nccl
// allocates the collectives' buffers on the rank's CUDA device (LOCAL_RANK modulo the visible
// devices, as the nccl backend picks it; the group is told the same device), fills and checks host
// mirrors and copies between them outside the timed loop (runner.h). Each timed iteration ends when
// Work::wait() returns, which for nccl (run with NcclOptions::blockingWait, so that wait()
// blocks the host rather than only the caller's stream) is when the collective's CUDA event has
// completed: the device work is in the time, as in nccl-tests.
//
// How each op maps onto the ProcessGroup API: every op passes both buffers, out of place
// through the out-of-place overloads of all_reduce, broadcast and reduce (in place: nccl-tests'
// layout, the same buffer, or input inside the output or output inside the input).
// sendrecv sends to rank+1 and receives from rank-1 (every rank posts its recv first, see run()).
//
// Environment: LOOM_SHM=0 turns the shared-memory path of the tcp backend off (TCP only);
// LOOM_ALGO forces a comm algorithm (or --algo). --tune [FILE] measures the algorithm choice per
// size instead (tune.h) and writes this host's tuning cache, which every group on the host
// reads, or the tuning file FILE that LOOM_TUNING_FILE loads.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>

#include "cuda_memory.h"
#include "loom/bench/runner.h"
#include "loom/bench/sizes.h"
#include "loom/cli/checks.h"
#include "loom/comm/collectives.h"
#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/init.h"
#include "loom/process_group/process_group.h"
#include "tune.h"

namespace loom::bench {
namespace {

DType toDType(ElemType type) {
  switch (type) {
    case ElemType::kFloat:
      return DType::kFloat32;
    case ElemType::kDouble:
      return DType::kFloat64;
    case ElemType::kHalf:
      return DType::kFloat16;
    case ElemType::kBFloat16:
      return DType::kBFloat16;
    case ElemType::kInt8:
      return DType::kInt8;
    case ElemType::kUInt8:
      return DType::kUInt8;
    case ElemType::kInt32:
      return DType::kInt32;
    case ElemType::kInt64:
      return DType::kInt64;
  }
  return DType::kUInt8;
}

ReduceOp toReduceOp(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return ReduceOp::kSum;
    case RedOp::kProd:
      return ReduceOp::kProd;
    case RedOp::kMin:
      return ReduceOp::kMin;
    case RedOp::kMax:
      return ReduceOp::kMax;
    case RedOp::kAvg:
      return ReduceOp::kAvg;
  }
  return ReduceOp::kSum;
}

// Where the collectives' buffers live: host memory, or a CUDA device (`memory` set).
struct Memory {
  std::unique_ptr<DeviceMemory> memory;  // null: host
  Device device;                         // what the BufferViews say
  std::string label;                     // "[cpu]", "[cuda:1] NVIDIA H100 80GB HBM3"
};

class LoomDriver : public Driver {
 public:
  LoomDriver(std::shared_ptr<ProcessGroup> pg, Memory memory)
      : pg_(std::move(pg)), mem_(std::move(memory)) {}

  int rank() const override { return pg_->rank(); }
  int worldSize() const override { return pg_->size(); }
  std::string series() const override { return "loom " + pg_->backendName(); }
  std::string deviceLine() const override {
    const int index = mem_.device.type == DeviceType::kCuda ? mem_.device.index : 0;
    return " " + std::to_string(index) + " " + mem_.label + " " + series() + " over " +
           pg_->transportSummary();
  }
  DeviceMemory* deviceMemory() override { return mem_.memory.get(); }

  std::string unsupported(Op op, ElemType, RedOp) const override {
    if (op == Op::kSendRecv && pg_->size() < 2) return "sendrecv needs at least 2 ranks";
    return {};
  }

  std::string inPlaceUnsupported(Op op) const override {
    if (op == Op::kSendRecv) return "send and receive through one buffer is not defined";
    return {};
  }

  void run(const Call& c) override {
    const DType dtype = toDType(c.type);
    const size_t n = c.count;
    const size_t world = static_cast<size_t>(pg_->size());
    void* send = const_cast<void*>(c.send);
    auto buf = [&](void* data, size_t count) {
      return BufferView{data, count, dtype, mem_.device};
    };
    switch (c.op) {
      // In place, send and recv are one buffer (nccl-tests' layout): the same calls.
      case Op::kAllReduce: {
        AllreduceOptions opts;
        opts.reduceOp = toReduceOp(c.redop);
        pg_->allreduce(buf(send, n), buf(c.recv, n), opts)->wait();
      } break;
      case Op::kBroadcast: {
        BroadcastOptions opts;
        opts.root = c.root;
        pg_->broadcast(buf(send, n), buf(c.recv, n), opts)->wait();
      } break;
      case Op::kReduce: {
        ReduceOptions opts;
        opts.reduceOp = toReduceOp(c.redop);
        opts.root = c.root;
        pg_->reduce(buf(send, n), buf(c.recv, n), opts)->wait();
      } break;
      case Op::kAllGather:
        pg_->allgather(buf(send, n), buf(c.recv, n * world))->wait();
        break;
      case Op::kReduceScatter: {
        ReduceScatterOptions opts;
        opts.reduceOp = toReduceOp(c.redop);
        pg_->reduceScatter(buf(send, n * world), buf(c.recv, n), opts)->wait();
      } break;
      case Op::kGather: {
        GatherOptions opts;
        opts.root = c.root;
        pg_->gather(buf(send, n), buf(c.recv, n * world), opts)->wait();
      } break;
      case Op::kScatter: {
        ScatterOptions opts;
        opts.root = c.root;
        pg_->scatter(buf(send, n * world), buf(c.recv, n), opts)->wait();
      } break;
      case Op::kAllToAll:
        pg_->alltoall(buf(send, n * world), buf(c.recv, n * world))->wait();
        break;
      case Op::kBarrier:
        pg_->barrier()->wait();
        break;
      case Op::kSendRecv: {
        // Post the receive first, as c10d users do: point-to-point operations are not queued
        // behind each other, so the ring cannot deadlock (pg_thread_test checks this).
        const int next = (pg_->rank() + 1) % pg_->size();
        const int prev = (pg_->rank() + pg_->size() - 1) % pg_->size();
        auto received = pg_->recv(buf(c.recv, n), prev);
        auto sent = pg_->send(buf(send, n), next);
        received->wait();
        sent->wait();
        break;
      }
    }
  }

  void barrier() override { pg_->barrier()->wait(); }

  // Through the group, so on the device when the group only takes device buffers (nccl).
  void allgatherDoubles(const double* in, size_t count, double* out) override {
    const size_t total = count * static_cast<size_t>(pg_->size());
    if (!mem_.memory || mem_.device.type != DeviceType::kCuda) {
      pg_->allgather(BufferView{const_cast<double*>(in), count, DType::kFloat64, {}},
                     BufferView{out, total, DType::kFloat64, {}})
          ->wait();
      return;
    }
    DeviceMemory& m = *mem_.memory;
    auto* dev = static_cast<double*>(m.allocate((count + total) * sizeof(double)));
    try {
      m.toDevice(dev, in, count * sizeof(double));
      pg_->allgather(BufferView{dev, count, DType::kFloat64, mem_.device},
                     BufferView{dev + count, total, DType::kFloat64, mem_.device})
          ->wait();
      m.toHost(out, dev + count, total * sizeof(double));
    } catch (...) {
      m.release(dev);
      throw;
    }
    m.release(dev);
  }

 private:
  std::shared_ptr<ProcessGroup> pg_;
  Memory mem_;
};

// Host memory in Loom Windows (loom/comm/window.h, -R 1): what peers on the host read
// directly over shared memory. The fills and checks copy in and out, as for a device.
class WindowMemory final : public DeviceMemory {
 public:
  bool hostWritable() const override { return true; }
  void* allocate(size_t bytes) override {
    auto window = comm::Window::allocate(std::max<size_t>(bytes, 1));
    void* p = window->data();
    windows_[p] = std::move(window);
    return p;
  }
  void release(void* p) noexcept override { windows_.erase(p); }
  void toDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void toHost(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }

 private:
  std::map<void*, std::shared_ptr<comm::Window>> windows_;
};

// Host memory for tcp and verbs (in Loom Windows with `windows`); for nccl the CUDA device the
// group will use (LOCAL_RANK modulo the visible devices). Throws NotAvailableError without one.
Memory memoryFor(const std::string& backend, bool windows) {
  Memory m;
  m.label = "[cpu]";
  if (windows) {
    LOOM_CHECK(backend == "tcp",
               "-R/--register 1 (buffers in Loom windows) needs --backend tcp "
               "(its shared-memory path reads them); got --backend ",
               backend);
    m.memory = std::make_unique<WindowMemory>();
    m.label = "[cpu, window]";
    return m;
  }
  if (backend != "nccl") return m;
  const int devices = cudaDevices();
  const LaunchEnv launch = parseLaunchEnv(launchEnvironment(), /*needMaster=*/false);
  const int index = devices > 0 ? launch.localRank % devices : 0;
  m.memory = makeCudaMemory(index);  // NotAvailableError without CUDA or without a device
  m.device = Device::cuda(index);
  m.label = "[cuda:" + std::to_string(index) + "] " + cudaDeviceName(index);
  return m;
}

// The straggler table over the flight recorder's last operations (every rank calls it; rank 0
// prints the slowest rank as a comment line, or why it was not measured). The barrier
// keeps rank 0, which may host the store, alive until every rank has read the exchange.
void printSlowestRank(ProcessGroup& pg) {
  try {
    const diag::StragglerTable table = pg.stragglers(std::chrono::seconds(30));
    pg.barrier()->wait();
    const int slow = table.slowest();
    if (pg.rank() != 0 || slow < 0) return;
    const std::string text = table.format();
    std::cout << "# " << text.substr(text.rfind('\n') + 1) << std::endl;
  } catch (const InvalidArgumentError& e) {
    // LOOM_FLIGHT_RECORDER_ENTRIES=0, or an mpi group without a shared store: said, not waited.
    if (pg.rank() == 0) std::cout << "# slowest rank: not measured: " << e.what() << std::endl;
  }
}

int loomBenchMain(int argc, char** argv) {
  CLI::App app{
      "Collective microbenchmark over Loom's ProcessGroup, nccl-tests compatible "
      "(start it with loom-run, torchrun, srun or mpirun). Exit status: 0 ok, 1 wrong "
      "results, 2 bad flags, 3 group or operation failure.",
      "loom-bench"};
  SweepFlags flags;
  SweepOptions options;
  std::string backend = "tcp";
  std::string initMethod;
  std::string algo;
  std::string tuneFile;
  std::string tuneMax = "64M";
  size_t tuneMaxBytes = 0;
  int timeoutS = 300;
  int registerMode = 0;
  addSweepFlags(app, flags);
  app.add_option("--backend", backend,
                 "tcp (host buffers; LOOM_SHM=0 keeps same-host peers on TCP), nccl (CUDA "
                 "buffers on device LOCAL_RANK modulo the visible devices), verbs (host "
                 "buffers, RDMA) or mpi (host buffers, Open MPI's collectives; run under "
                 "mpirun); a backend that is not available exits with status 3")
      ->capture_default_str();
  app.add_option("--init-method", initMethod,
                 "env:// (default; LOOM_INIT_METHOD), tcp://host:port or file:///path");
  app.add_option("--algo", algo,
                 "force a comm algorithm (ring, rd, hd, direct, tree, chain) on the collectives "
                 "that have it, over the transport (they leave shared memory); the others keep "
                 "their automatic choice. auto, or absent: LOOM_ALGO when set, else automatic");
  CLI::Option* tune = app.add_option(
      "--tune", tuneFile,
      "instead of the sweep, time every algorithm of all-reduce, broadcast, all-gather and "
      "reduce-scatter at per-rank sizes 4K, 16K, .. up to --tune-max for the job's topology and "
      "write the winners (per-size rules and crossovers; other topologies are kept). Without "
      "FILE: into this host's tuning cache ($XDG_CACHE_HOME/loom/tuning-<fingerprint>.json, "
      "LOOM_TUNING_CACHE), which every group on this host then reads; with FILE: a text tuning "
      "file (a JSON cache when FILE ends in .json) that groups load with LOOM_TUNING_FILE");
  tune->expected(0, 1);
  app.add_option("--tune-max", tuneMax,
                 "largest per-rank size --tune times (bytes; K, M, G suffixes; 4K to 1G); the "
                 "last rule holds above it")
      ->capture_default_str();
  app.add_option("--timeout", timeoutS, "deadline of setup and of every operation, seconds")
      ->check(cli::wholeAtLeast(1))
      ->capture_default_str();
  app.add_option("-R,--register", registerMode,
                 "0: the collectives' buffers are ordinary host memory; 1: they are Loom windows "
                 "(loom::comm::Window, zero-copy shared memory: same-host peers read them "
                 "directly, and a broadcast's root may write the receivers'; tcp backend only), "
                 "as nccl-tests -R registers its buffers")
      ->check(cli::wholeIn(0, 1))
      ->capture_default_str();
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  if (auto code = parseCommandLine(app, argc, argv, [&] {
        options = flags.resolve();
        const std::vector<std::string> names = backendNames();
        LOOM_CHECK(std::find(names.begin(), names.end(), backend) != names.end(),
                   "--backend: unknown backend '", backend, "': expected tcp, nccl, verbs or mpi");
        LOOM_CHECK(timeoutS > 0, "--timeout must be positive, got ", timeoutS);
        if (!algo.empty()) algorithm = comm::parseAlgorithm(algo);
        tuneMaxBytes = parseSize(tuneMax);
        LOOM_CHECK(tuneMaxBytes >= (size_t{4} << 10) && tuneMaxBytes <= (size_t{1} << 30),
                   "--tune-max must be 4K to 1G per rank, got ", tuneMax);
        if (!initMethod.empty()) parseInitMethod(initMethod);
        if (tune->count() > 0) {
          // --tune times Loom's own algorithms over a tcp Context at its own sizes: the sweep's
          // flags would be ignored, and the other backends have nothing of Loom's to tune.
          LOOM_CHECK(backend == "tcp",
                     "--tune times Loom's own algorithms (the tcp backend: "
                     "shared memory within a host, tcp between hosts); --backend ",
                     backend, " has none to tune");
          for (const char* name :
               {"--op", "--minbytes", "--maxbytes", "--stepfactor", "--iters", "--small-iters",
                "--warmup_iters", "--check", "--touch", "--touch-values", "--datatype", "--op_type",
                "--root", "--json", "--csv", "--plot", "--series", "--algo", "--register"}) {
            LOOM_CHECK(app.get_option(name)->count() == 0, name,
                       " has no effect with --tune (it times every algorithm of all-reduce, "
                       "broadcast, all-gather and reduce-scatter at per-rank sizes 4K to "
                       "--tune-max); leave it out");
          }
        } else {
          LOOM_CHECK(app.get_option("--tune-max")->count() == 0,
                     "--tune-max has an effect only with --tune");
        }
      })) {
    return *code;
  }
  InitOptions init;
  init.backend = backend;
  init.initMethod = initMethod;
  init.pg.timeout = std::chrono::seconds(timeoutS);
  init.pg.comm.context.algorithm = algorithm;
  int rank = rankFromEnvironment();  // valid: parseCommandLine checked it
  try {
    Memory memory = memoryFor(backend, registerMode == 1);
    if (memory.device.type == DeviceType::kCuda) init.pg.nccl.device = memory.device.index;
    init.pg.nccl.blockingWait = true;  // the timed loop ends when the device work is done
    InitResult group = initProcessGroup(init);
    rank = group.pg->rank();
    if (tune->count() > 0) {
      return runTune(*group.store, rank, group.pg->size(), tuneFile, tuneMaxBytes,
                     std::chrono::seconds(timeoutS));
    }
    LoomDriver driver(group.pg, std::move(memory));
    const int code =
        runSweep(driver, options, "loom-bench", std::vector<std::string>(argv, argv + argc));
    printSlowestRank(*group.pg);
    return code;
  } catch (const InvalidArgumentError& e) {  // e.g. -r beyond the world size
    // One write: the ranks share stderr, and piecewise writes interleave mid-line.
    std::cerr << ("loom-bench: rank " + std::to_string(rank) + ": " + e.what() + "\n")
              << std::flush;
    return 2;
  } catch (const std::exception& e) {
    // One write: the ranks share stderr, and piecewise writes interleave mid-line.
    std::cerr << ("loom-bench: rank " + std::to_string(rank) + ": " + e.what() + "\n")
              << std::flush;
    return 3;
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  return loom::bench::loomBenchMain(argc, argv);
}
