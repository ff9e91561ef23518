// loom-bench: collective microbenchmark over Loom's ProcessGroup, nccl-tests compatible.
//
// Start one process per rank with loom-run (or torchrun, srun, mpirun): the group comes from
// the launcher's environment (process_group/init.h), or from --init-method. Every rank runs
// the sweep of bench/report (runner.h); rank 0 prints the nccl-tests table and writes --json,
// --csv and --plot. The exit status is 0, 1 when any element was wrong on any rank (-c 1), 2
// for a bad flag (or a root outside the world), 3 when the group could not be created or an
// operation failed (also for
// --backend nccl, whose CUDA buffers this program does not allocate yet, and verbs, which the
// process group does not implement yet).
//
// How each op maps onto the ProcessGroup API (whose all_reduce, broadcast and reduce are
// in place only, like c10d's): out-of-place all_reduce, broadcast (root) and reduce copy the
// input into the output buffer and run in place there; that copy is part of the time, as it is
// for a c10d user. all_gather, reduce_scatter, gather, scatter and alltoall pass both buffers
// (in place: nccl-tests' layout, input inside the output or output inside the input).
// sendrecv sends to rank+1 and receives from rank-1 (even ranks send first, see run()).
//
// Environment: LOOM_SHM=0 turns the shared-memory path of the tcp backend off (TCP only);
// LOOM_ALGO forces a comm algorithm (or --algo).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "loom/bench/runner.h"
#include "loom/comm/collectives.h"
#include "loom/common/env.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/init.h"
#include "loom/process_group/process_group.h"

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

class LoomDriver : public Driver {
 public:
  explicit LoomDriver(std::shared_ptr<ProcessGroup> pg) : pg_(std::move(pg)) {}

  int rank() const override { return pg_->rank(); }
  int worldSize() const override { return pg_->size(); }
  std::string series() const override { return "loom " + pg_->backendName(); }

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
    const size_t bytes = n * elemSize(c.type);
    void* send = const_cast<void*>(c.send);
    auto buf = [&](void* data, size_t count) { return BufferView{data, count, dtype, {}}; };
    switch (c.op) {
      case Op::kAllReduce:
        if (!c.inPlace) std::memcpy(c.recv, send, bytes);
        {
          AllreduceOptions opts;
          opts.reduceOp = toReduceOp(c.redop);
          pg_->allreduce(buf(c.recv, n), opts)->wait();
        }
        break;
      case Op::kBroadcast:
        if (!c.inPlace && pg_->rank() == c.root) std::memcpy(c.recv, send, bytes);
        {
          BroadcastOptions opts;
          opts.root = c.root;
          pg_->broadcast(buf(c.recv, n), opts)->wait();
        }
        break;
      case Op::kReduce:
        if (!c.inPlace) std::memcpy(c.recv, send, bytes);
        {
          ReduceOptions opts;
          opts.reduceOp = toReduceOp(c.redop);
          opts.root = c.root;
          pg_->reduce(buf(c.recv, n), opts)->wait();
        }
        break;
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

  void allgatherDoubles(const double* in, size_t count, double* out) override {
    pg_->allgather(BufferView{const_cast<double*>(in), count, DType::kFloat64, {}},
                   BufferView{out, count * static_cast<size_t>(pg_->size()), DType::kFloat64, {}})
        ->wait();
  }

 private:
  std::shared_ptr<ProcessGroup> pg_;
};

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
  int timeoutS = 300;
  addSweepFlags(app, flags);
  app.add_option("--backend", backend,
                 "tcp (nccl and verbs are named but not runnable yet: they exit with status 3)")
      ->capture_default_str();
  app.add_option("--init-method", initMethod,
                 "env:// (default; LOOM_INIT_METHOD), tcp://host:port or file:///path");
  app.add_option("--algo", algo,
                 "force a comm algorithm for every collective (auto, ring, rd, hd, direct, tree, "
                 "chain); default: LOOM_ALGO or automatic");
  app.add_option("--timeout", timeoutS, "deadline of setup and of every operation, seconds")
      ->capture_default_str();
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  if (auto code = parseCommandLine(app, argc, argv, [&] {
        options = flags.resolve();
        const std::vector<std::string> names = backendNames();
        LOOM_CHECK(std::find(names.begin(), names.end(), backend) != names.end(),
                   "--backend: unknown backend '", backend, "': expected tcp, nccl or verbs");
        LOOM_CHECK(timeoutS > 0, "--timeout must be positive, got ", timeoutS);
        if (!algo.empty()) algorithm = comm::parseAlgorithm(algo);
        if (!initMethod.empty()) parseInitMethod(initMethod);
      })) {
    return *code;
  }
  if (backend == "nccl") {
    std::cerr << "loom-bench: --backend nccl needs CUDA buffers, which this build of "
                 "loom-bench does not allocate yet (it benchmarks host memory)\n";
    return 3;
  }

  InitOptions init;
  init.backend = backend;
  init.initMethod = initMethod;
  init.pg.timeout = std::chrono::seconds(timeoutS);
  init.pg.algorithm = algorithm;
  int rank = rankFromEnvironment();  // valid: parseCommandLine checked it
  try {
    init.pg.sharedMemory = env::flag("LOOM_SHM", true);
    InitResult group = initProcessGroup(init);
    rank = group.pg->rank();
    LoomDriver driver(group.pg);
    return runSweep(driver, options, "loom-bench", std::vector<std::string>(argv, argv + argc));
  } catch (const InvalidArgumentError& e) {  // e.g. -r beyond the world size
    std::cerr << "loom-bench: rank " << rank << ": " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom-bench: rank " << rank << ": " << e.what() << std::endl;
    return 3;
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  return loom::bench::loomBenchMain(argc, argv);
}
