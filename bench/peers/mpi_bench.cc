// mpi_bench: the loom-bench sweep over MPI (MPI_Allreduce and friends), with the same flags,
// columns, checks and files. Which transport MPI uses is mpirun's choice:
//   mpirun --mca btl self,vader ...                                  shared memory
//   mpirun --mca btl self,tcp --mca btl_tcp_if_include lo ...        TCP over loopback
// (scripts/peers.sh runs both). Name the run with --series, e.g. --series "mpi tcp".
//
// Mapping: all_reduce MPI_Allreduce, broadcast MPI_Bcast, all_gather MPI_Allgather,
// reduce_scatter MPI_Reduce_scatter_block, reduce MPI_Reduce, gather MPI_Gather, scatter
// MPI_Scatter, alltoall MPI_Alltoall, barrier MPI_Barrier, sendrecv MPI_Sendrecv to rank+1
// from rank-1 (MPI_Sendrecv_replace in place). In-place uses MPI_IN_PLACE where MPI defines it.
// Two places where MPI's API differs from nccl-tests' layout cost a local copy, counted in the
// time: out-of-place broadcast copies the root's input to its output, and in-place
// reduce_scatter moves the result from the start of the buffer to this rank's slice.
// MPI has no half or bfloat16 type and no average reduction: those rows are skipped.
#include <mpi.h>

#include <cstring>
#include <iostream>

#include "loom/bench/runner.h"
#include "loom/common/error.h"

namespace loom::bench {
namespace {

void mpiCheck(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    LOOM_THROW(IoError, what, " failed: ", std::string(text, static_cast<size_t>(len)));
  }
}

MPI_Datatype mpiType(ElemType type) {
  switch (type) {
    case ElemType::kFloat:
      return MPI_FLOAT;
    case ElemType::kDouble:
      return MPI_DOUBLE;
    case ElemType::kInt8:
      return MPI_INT8_T;
    case ElemType::kUInt8:
      return MPI_UINT8_T;
    case ElemType::kInt32:
      return MPI_INT32_T;
    case ElemType::kInt64:
      return MPI_INT64_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiOp(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return MPI_SUM;
    case RedOp::kProd:
      return MPI_PROD;
    case RedOp::kMin:
      return MPI_MIN;
    case RedOp::kMax:
      return MPI_MAX;
    default:
      return MPI_OP_NULL;
  }
}

class MpiDriver : public Driver {
 public:
  MpiDriver() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int worldSize() const override { return size_; }
  std::string series() const override { return "mpi"; }

  std::string unsupported(Op op, ElemType type, RedOp redop) const override {
    if (op == Op::kBarrier) return {};
    if (mpiType(type) == MPI_DATATYPE_NULL) {
      return std::string("MPI has no ") + elemTypeName(type) + " type";
    }
    if (opUsesRedop(op) && mpiOp(redop) == MPI_OP_NULL) {
      return std::string("MPI has no ") + redOpName(redop) + " reduction";
    }
    return {};
  }

  void run(const Call& c) override {
    const MPI_Datatype t = mpiType(c.type);
    const MPI_Op op = mpiOp(c.redop);
    const int n = static_cast<int>(c.count);
    const bool root = rank_ == c.root;
    const size_t bytes = c.count * elemSize(c.type);
    switch (c.op) {
      case Op::kAllReduce:
        mpiCheck(MPI_Allreduce(c.inPlace ? MPI_IN_PLACE : c.send, c.recv, n, t, op, MPI_COMM_WORLD),
                 "MPI_Allreduce");
        break;
      case Op::kBroadcast:
        mpiCheck(MPI_Bcast(root ? const_cast<void*>(c.send) : c.recv, n, t, c.root, MPI_COMM_WORLD),
                 "MPI_Bcast");
        if (root && !c.inPlace) std::memcpy(c.recv, c.send, bytes);
        break;
      case Op::kAllGather:
        mpiCheck(
            MPI_Allgather(c.inPlace ? MPI_IN_PLACE : c.send, n, t, c.recv, n, t, MPI_COMM_WORLD),
            "MPI_Allgather");
        break;
      case Op::kReduceScatter:
        if (c.inPlace) {
          void* base = const_cast<void*>(c.send);
          mpiCheck(MPI_Reduce_scatter_block(MPI_IN_PLACE, base, n, t, op, MPI_COMM_WORLD),
                   "MPI_Reduce_scatter_block");
          if (base != c.recv) std::memmove(c.recv, base, bytes);
        } else {
          mpiCheck(MPI_Reduce_scatter_block(c.send, c.recv, n, t, op, MPI_COMM_WORLD),
                   "MPI_Reduce_scatter_block");
        }
        break;
      case Op::kReduce:
        mpiCheck(MPI_Reduce(c.inPlace && root ? MPI_IN_PLACE : c.send, c.recv, n, t, op, c.root,
                            MPI_COMM_WORLD),
                 "MPI_Reduce");
        break;
      case Op::kGather:
        mpiCheck(MPI_Gather(c.inPlace && root ? MPI_IN_PLACE : c.send, n, t, c.recv, n, t, c.root,
                            MPI_COMM_WORLD),
                 "MPI_Gather");
        break;
      case Op::kScatter:
        mpiCheck(MPI_Scatter(c.send, n, t, c.inPlace && root ? MPI_IN_PLACE : c.recv, n, t, c.root,
                             MPI_COMM_WORLD),
                 "MPI_Scatter");
        break;
      case Op::kAllToAll:
        mpiCheck(
            MPI_Alltoall(c.inPlace ? MPI_IN_PLACE : c.send, n, t, c.recv, n, t, MPI_COMM_WORLD),
            "MPI_Alltoall");
        break;
      case Op::kBarrier:
        mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        break;
      case Op::kSendRecv: {
        const int next = (rank_ + 1) % size_;
        const int prev = (rank_ + size_ - 1) % size_;
        if (c.inPlace) {
          mpiCheck(MPI_Sendrecv_replace(c.recv, n, t, next, 0, prev, 0, MPI_COMM_WORLD,
                                        MPI_STATUS_IGNORE),
                   "MPI_Sendrecv_replace");
        } else {
          mpiCheck(MPI_Sendrecv(c.send, n, t, next, 0, c.recv, n, t, prev, 0, MPI_COMM_WORLD,
                                MPI_STATUS_IGNORE),
                   "MPI_Sendrecv");
        }
        break;
      }
    }
  }

  void barrier() override { mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void allgatherDoubles(const double* in, size_t count, double* out) override {
    mpiCheck(MPI_Allgather(in, static_cast<int>(count), MPI_DOUBLE, out, static_cast<int>(count),
                           MPI_DOUBLE, MPI_COMM_WORLD),
             "MPI_Allgather");
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};

int mpiBenchMain(int argc, char** argv) {
  CLI::App app{
      "The loom-bench sweep over MPI collectives (run it with mpirun; the transport "
      "is mpirun's --mca btl choice). Same flags, columns and checks as loom-bench.",
      "mpi_bench"};
  SweepFlags flags;
  SweepOptions options;
  addSweepFlags(app, flags);
  if (auto code = parseCommandLine(app, argc, argv, [&] { options = flags.resolve(); })) {
    return *code;
  }
  MPI_Init(&argc, &argv);
  int code = 1;
  try {
    MpiDriver driver;
    code = runSweep(driver, options, "mpi_bench", std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // One write: the ranks share stderr, and piecewise writes interleave mid-line.
    std::cerr << ("mpi_bench: rank " + std::to_string(rank) + ": " + e.what() + "\n") << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  return loom::bench::mpiBenchMain(argc, argv);
}
