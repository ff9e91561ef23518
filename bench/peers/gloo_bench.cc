// gloo_bench: the loom-bench sweep over Gloo (Debian's libgloo-dev, TCP transport), with the
// same flags, columns, checks and files. Ranks come from RANK / WORLD_SIZE (loom-run, torchrun)
// or Open MPI's variables (mpirun); they meet through a Gloo FileStore in --store-dir, which
// must be a fresh empty directory for every run (scripts/peers.sh makes one).
//
// Algorithms (--algo, all_reduce only):
//   ring              gloo::allreduce, new-style API, RING (what PyTorch's gloo backend calls)
//   bcube             gloo::allreduce, new-style API, BCUBE
//   legacy_ring       gloo::AllreduceRing
//   ring_chunked      gloo::AllreduceRingChunked
//   halving_doubling  gloo::AllreduceHalvingDoubling
// The legacy algorithms are in-place objects built once per buffer (built outside the timed
// loop, cached while the buffer stays the same); out-of-place runs copy the input into the
// output first, and that copy is part of the time, as it is for a user of those classes.
// Other ops use the new-style API: gloo::broadcast, allgather, reduce, gather, scatter,
// alltoall, barrier, and unbound-buffer send/recv for sendrecv; reduce_scatter uses
// gloo::ReduceScatterHalvingDoubling (in-place, result at the start of the buffer: out-of-place
// copies the input to a scratch buffer first and the result out; in-place moves the result to
// this rank's slice, as MPI's in-place reduce_scatter does). Gloo has no bfloat16 type and no
// average reduction: those rows are skipped.
#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "loom/bench/runner.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace loom::bench {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduceFn(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return &gloo::sum<T>;
    case RedOp::kProd:
      return &gloo::product<T>;
    case RedOp::kMin:
      return &gloo::min<T>;
    case RedOp::kMax:
      return &gloo::max<T>;
    default:
      return nullptr;
  }
}

template <typename T>
const gloo::ReductionFunction<T>* legacyFn(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return gloo::ReductionFunction<T>::sum;
    case RedOp::kProd:
      return gloo::ReductionFunction<T>::product;
    case RedOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case RedOp::kMax:
      return gloo::ReductionFunction<T>::max;
    default:
      return nullptr;
  }
}

// Calls fn.template operator()<T>() with T the C++ type Gloo uses for `type`.
template <typename Fn>
void dispatch(ElemType type, Fn&& fn) {
  switch (type) {
    case ElemType::kFloat:
      return fn.template operator()<float>();
    case ElemType::kDouble:
      return fn.template operator()<double>();
    case ElemType::kHalf:
      return fn.template operator()<gloo::float16>();
    case ElemType::kInt8:
      return fn.template operator()<int8_t>();
    case ElemType::kUInt8:
      return fn.template operator()<uint8_t>();
    case ElemType::kInt32:
      return fn.template operator()<int32_t>();
    case ElemType::kInt64:
      return fn.template operator()<int64_t>();
    case ElemType::kBFloat16:
      LOOM_THROW(InvalidArgumentError, "Gloo has no bfloat16 type");
  }
}

const std::vector<std::string>& algorithms() {
  static const std::vector<std::string> names = {"ring", "bcube", "legacy_ring", "ring_chunked",
                                                 "halving_doubling"};
  return names;
}

class GlooDriver : public Driver {
 public:
  GlooDriver(std::shared_ptr<gloo::Context> context, std::string algo)
      : ctx_(std::move(context)), algo_(std::move(algo)) {}

  int rank() const override { return ctx_->rank; }
  int worldSize() const override { return ctx_->size; }
  std::string series() const override { return "gloo " + algo_; }

  std::string unsupported(Op op, ElemType type, RedOp redop) const override {
    if (op == Op::kBarrier) return {};
    if (type == ElemType::kBFloat16) return "Gloo has no bfloat16 type";
    if (opUsesRedop(op) && redop == RedOp::kAvg) return "Gloo has no average reduction";
    return {};
  }

  std::string inPlaceUnsupported(Op op) const override {
    if (op == Op::kAllToAll) return "gloo::alltoall has no in-place form";
    if (op == Op::kSendRecv) return "send and receive through one buffer is not defined";
    return {};
  }

  void run(const Call& c) override {
    dispatch(c.type, [&]<typename T>() { runTyped<T>(c); });
  }

  void barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }

  void allgatherDoubles(const double* in, size_t count, double* out) override {
    gloo::AllgatherOptions opts(ctx_);
    opts.setInput(const_cast<double*>(in), count);
    opts.setOutput(out, count * static_cast<size_t>(ctx_->size));
    gloo::allgather(opts);
  }

 private:
  template <typename T>
  void runTyped(const Call& c) {
    // Gloo's collectives divide by the element count (gloo::allgather dies with SIGFPE on an
    // empty buffer); an empty collective has nothing to move, so it is not called.
    if (c.op != Op::kBarrier && c.count == 0) return;
    T* send = static_cast<T*>(const_cast<void*>(c.send));
    T* recv = static_cast<T*>(c.recv);
    const size_t n = c.count;
    const size_t world = static_cast<size_t>(ctx_->size);
    const bool root = ctx_->rank == c.root;
    switch (c.op) {
      case Op::kAllReduce:
        if (algo_ == "ring" || algo_ == "bcube") {
          gloo::AllreduceOptions opts(ctx_);
          opts.setAlgorithm(algo_ == "ring" ? gloo::AllreduceOptions::Algorithm::RING
                                            : gloo::AllreduceOptions::Algorithm::BCUBE);
          if (!c.inPlace) opts.setInput(send, n);
          opts.setOutput(recv, n);
          opts.setReduceFunction(reduceFn<T>(c.redop));
          gloo::allreduce(opts);
        } else {
          if (!c.inPlace) std::memcpy(static_cast<void*>(recv), send, n * sizeof(T));
          legacy<T>(c, recv, n).run();
        }
        break;
      case Op::kBroadcast: {
        gloo::BroadcastOptions opts(ctx_);
        if (root && !c.inPlace) opts.setInput(send, n);
        opts.setOutput(recv, n);
        opts.setRoot(c.root);
        gloo::broadcast(opts);
        break;
      }
      case Op::kAllGather: {
        gloo::AllgatherOptions opts(ctx_);
        if (!c.inPlace) opts.setInput(send, n);
        opts.setOutput(recv, n * world);
        gloo::allgather(opts);
        break;
      }
      case Op::kReduceScatter: {
        T* buffer = send;  // in place: the whole input, with this rank's slice inside it
        if (!c.inPlace) {
          scratch_.resize(n * world * sizeof(T));
          buffer = reinterpret_cast<T*>(scratch_.data());
          std::memcpy(static_cast<void*>(buffer), send, n * world * sizeof(T));
        }
        legacy<T>(c, buffer, n).run();
        // The algorithm leaves this rank's reduced slice at the start of the buffer.
        if (buffer != recv) std::memmove(static_cast<void*>(recv), buffer, n * sizeof(T));
        break;
      }
      case Op::kReduce: {
        gloo::ReduceOptions opts(ctx_);
        if (!c.inPlace) opts.setInput(send, n);
        opts.setOutput(recv, n);
        opts.setRoot(c.root);
        opts.setReduceFunction(reduceFn<T>(c.redop));
        gloo::reduce(opts);
        break;
      }
      case Op::kGather: {
        gloo::GatherOptions opts(ctx_);
        opts.setInput(send, n);
        if (root) opts.setOutput(recv, n * world);
        opts.setRoot(c.root);
        gloo::gather(opts);
        break;
      }
      case Op::kScatter: {
        gloo::ScatterOptions opts(ctx_);
        if (root) {
          std::vector<T*> slices;
          for (size_t r = 0; r < world; ++r) slices.push_back(send + r * n);
          opts.setInputs(slices, n);
        }
        opts.setOutput(recv, n);
        opts.setRoot(c.root);
        gloo::scatter(opts);
        break;
      }
      case Op::kAllToAll: {
        gloo::AlltoallOptions opts(ctx_);
        opts.setInput(send, n * world);
        opts.setOutput(recv, n * world);
        gloo::alltoall(opts);
        break;
      }
      case Op::kBarrier:
        barrier();
        break;
      case Op::kSendRecv: {
        const int next = (ctx_->rank + 1) % ctx_->size;
        const int prev = (ctx_->rank + ctx_->size - 1) % ctx_->size;
        auto out = ctx_->createUnboundBuffer(send, n * sizeof(T));
        auto in = ctx_->createUnboundBuffer(recv, n * sizeof(T));
        in->recv(prev, kSendRecvSlot);
        out->send(next, kSendRecvSlot);
        out->waitSend();
        in->waitRecv();
        break;
      }
    }
  }

  // The legacy algorithm object for this call, built on first use of this buffer and kept
  // while the same buffer, count, type and reduction come back (every timed iteration).
  template <typename T>
  gloo::Algorithm& legacy(const Call& c, T* buffer, size_t count) {
    const auto key = std::make_tuple(static_cast<int>(c.op), static_cast<int>(c.type),
                                     static_cast<int>(c.redop), static_cast<void*>(buffer), count);
    if (!legacy_ || key != legacyKey_) {
      legacy_.reset();
      const auto fn = legacyFn<T>(c.redop);
      const int n = static_cast<int>(count);
      std::vector<T*> ptrs = {buffer};
      if (c.op == Op::kReduceScatter) {
        std::vector<int> recvElems(static_cast<size_t>(ctx_->size), n);
        legacy_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(
            ctx_, ptrs, n * ctx_->size, recvElems, fn);
      } else if (algo_ == "legacy_ring") {
        legacy_ = std::make_unique<gloo::AllreduceRing<T>>(ctx_, ptrs, n, fn);
      } else if (algo_ == "ring_chunked") {
        legacy_ = std::make_unique<gloo::AllreduceRingChunked<T>>(ctx_, ptrs, n, fn);
      } else {
        legacy_ = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx_, ptrs, n, fn);
      }
      legacyKey_ = key;
    }
    return *legacy_;
  }

  static constexpr uint64_t kSendRecvSlot = 0x5e4d;
  std::shared_ptr<gloo::Context> ctx_;
  std::string algo_;
  std::unique_ptr<gloo::Algorithm> legacy_;
  std::tuple<int, int, int, void*, size_t> legacyKey_;
  std::vector<std::byte> scratch_;
};

// The first of `names` that is set, as the registry reads it (a rank or a world size); `fallback`
// when none is. A value that is not valid is an InvalidArgumentError naming the variable.
int launcherInteger(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    if (const std::optional<long long> v = loom::settings::integer(name)) {
      return static_cast<int>(*v);
    }
  }
  return fallback;
}

int glooBenchMain(int argc, char** argv) {
  CLI::App app{
      "The loom-bench sweep over Gloo's collectives (TCP transport). Same flags, "
      "columns and checks as loom-bench. Ranks from RANK/WORLD_SIZE or mpirun.",
      "gloo_bench"};
  SweepFlags flags;
  SweepOptions options;
  std::string algo = "ring";
  std::string storeDir;
  std::string hostname = "127.0.0.1";
  int timeoutS = 300;
  addSweepFlags(app, flags);
  app.add_option("--algo", algo,
                 "all_reduce algorithm: ring, bcube, legacy_ring, ring_chunked, halving_doubling")
      ->capture_default_str();
  app.add_option("--store-dir", storeDir,
                 "fresh empty directory for Gloo's FileStore rendezvous (required)");
  app.add_option("--hostname", hostname, "address this rank's TCP device listens on")
      ->capture_default_str();
  app.add_option("--timeout", timeoutS, "Gloo timeout for every operation, seconds")
      ->capture_default_str();
  if (auto code = parseCommandLine(app, argc, argv, [&] {
        options = flags.resolve();
        LOOM_CHECK(std::find(algorithms().begin(), algorithms().end(), algo) != algorithms().end(),
                   "--algo: unknown algorithm '", algo,
                   "': expected ring, bcube, legacy_ring, ring_chunked or halving_doubling");
        LOOM_CHECK(!storeDir.empty(), "--store-dir is required (a fresh empty directory)");
        LOOM_CHECK(timeoutS > 0, "--timeout must be positive, got ", timeoutS);
      })) {
    return *code;
  }
  int rank = -1, size = -1;
  try {
    rank = launcherInteger({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, -1);
    size = launcherInteger({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, -1);
  } catch (const loom::InvalidArgumentError& e) {
    std::cerr << "gloo_bench: " << e.what() << "\n";
    return 2;
  }
  if (rank < 0 || size < 1 || rank >= size) {
    std::cerr << "gloo_bench: set RANK and WORLD_SIZE (as loom-run and torchrun do) or start it "
                 "with mpirun; got RANK="
              << rank << " WORLD_SIZE=" << size << "\n";
    return 2;
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(timeoutS));
    context->connectFullMesh(store, device);
    GlooDriver driver(context, algo);
    return runSweep(driver, options, "gloo_bench", std::vector<std::string>(argv, argv + argc));
  } catch (const InvalidArgumentError& e) {  // e.g. -r beyond the world size
    // One write: the ranks share stderr, and piecewise writes interleave mid-line.
    std::cerr << ("gloo_bench: rank " + std::to_string(rank) + ": " + e.what() + "\n")
              << std::flush;
    return 2;
  } catch (const std::exception& e) {
    // One write: the ranks share stderr, and piecewise writes interleave mid-line.
    std::cerr << ("gloo_bench: rank " + std::to_string(rank) + ": " + e.what() + "\n")
              << std::flush;
    return 3;
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  return loom::bench::glooBenchMain(argc, argv);
}
