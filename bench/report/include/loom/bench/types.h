// The vocabulary of loom-bench and its peers: which collective, which element type, which
// reduction, and nccl-tests' conventions for turning a swept size into buffer counts and
// bandwidths. Self-contained (no comm/ types) so that the Gloo and MPI drivers can share it.
//
// Size convention (nccl-tests, doc/PERFORMANCE.md): the printed size S is
//   all_reduce, broadcast, reduce, sendrecv   the buffer on each rank;
//   all_gather, gather                        the gathered output (world size x per-rank input);
//   reduce_scatter, scatter                   the full input (world size x per-rank output);
//   alltoall                                  each rank's whole input (= its whole output).
// algbw = S / time, busbw = algbw x busBwFactor(op, n):
//   all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall, gather, scatter (n-1)/n;
//   broadcast, reduce, sendrecv 1; barrier moves no data (0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::bench {

enum class Op : uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
  kSendRecv,
};

// all_reduce, broadcast, all_gather, reduce_scatter, reduce, gather, scatter, alltoall,
// barrier, sendrecv.
const char* opName(Op op);
// Accepts the names above and the spellings without underscore (allreduce, allgather, ...).
// Throws InvalidArgumentError listing the accepted names otherwise.
Op parseOp(std::string_view name);
const std::vector<Op>& allOps();
bool opUsesRoot(Op op);   // broadcast, reduce, gather, scatter
bool opUsesRedop(Op op);  // all_reduce, reduce_scatter, reduce
bool opMovesData(Op op);  // everything but barrier

enum class ElemType : uint8_t { kFloat, kDouble, kHalf, kBFloat16, kInt8, kUInt8, kInt32, kInt64 };

size_t elemSize(ElemType type);
// float, double, half, bfloat16, int8, uint8, int32, int64 (nccl-tests' names).
const char* elemTypeName(ElemType type);
// Also accepts float32, fp32, float64, fp64, float16, fp16, bf16, char, int, long.
ElemType parseElemType(std::string_view name);
const std::vector<ElemType>& allElemTypes();
bool isFloatType(ElemType type);

enum class RedOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };

const char* redOpName(RedOp op);  // sum, prod, min, max, avg
RedOp parseRedOp(std::string_view name);
const std::vector<RedOp>& allRedOps();

// Buffer shapes for one row of the sweep, in elements unless named bytes.
struct Layout {
  size_t bytes = 0;      // S, the printed size
  size_t count = 0;      // S / element size, the printed count
  size_t opCount = 0;    // the count argument of the collective (per-rank piece for gathers)
  size_t sendCount = 0;  // elements in each rank's input buffer
  size_t recvCount = 0;  // elements in each rank's output buffer
  // In-place layout (nccl-tests): the input lives inside the output buffer at
  // sendInPlaceOffset * rank (all_gather, gather), or the output inside the input at
  // recvInPlaceOffset * rank (reduce_scatter, scatter); both 0 for the others.
  size_t sendInPlaceOffset = 0;
  size_t recvInPlaceOffset = 0;
};

// The layout nccl-tests uses for a swept size of `bytes` (rounded down to whole elements and,
// for the gathered ops, to a multiple of the world size).
Layout layoutFor(Op op, size_t bytes, ElemType type, int worldSize);

double busBwFactor(Op op, int worldSize);
// GB/s (1e9 bytes per second), as nccl-tests: {algbw, busbw} for S bytes in `seconds`.
struct Bandwidth {
  double alg = 0;
  double bus = 0;
};
Bandwidth bandwidth(Op op, size_t bytes, double seconds, int worldSize);

}  // namespace loom::bench
