// The generic engine: picks an algorithm by operation, size and world size (or the forced
// one, algorithms/select.h) and runs it over the Context's transport through an Op.
#include "algorithms/algorithms.h"
#include "algorithms/select.h"
#include "engine/engines.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"

namespace loom::comm {

namespace {

class GenericEngine final : public Engine {
 public:
  explicit GenericEngine(const GenericEngineOptions& options)
      : Engine(Kind::kGeneric, kAllCollectives | kUnevenCollectives), options_(options) {}

  void run(const CollectiveCall& c) override {
    const size_t bytes = c.count * dtypeSize(c.dtype);
    const Algorithm algo =
        selectAlgorithm(c.type, c.opts.algorithm, options_.algorithm, bytes, c.ctx.size(),
                        options_.crossovers ? &*options_.crossovers : nullptr);
    Op o(c.ctx, c.type, c.opts, options_.chunkBytes);
    if (c.count == 0 && (opBit(c.type) & kAllCollectives) != 0 && c.type != OpType::kBarrier) {
      return zeroCountExchange(o);
    }
    switch (c.type) {
      case OpType::kAllreduce:
        switch (algo) {
          case Algorithm::kRing:
            return allreduceRing(o, c.in, c.out, c.count, c.dtype, c.op);
          case Algorithm::kDirect:
            return allreduceDirect(o, c.in, c.out, c.count, c.dtype, c.op);
          case Algorithm::kHalvingDoubling:
            return allreduceHalvingDoubling(o, c.in, c.out, c.count, c.dtype, c.op);
          default:
            return allreduceRecursiveDoubling(o, c.in, c.out, c.count, c.dtype, c.op);
        }
      case OpType::kBroadcast:
        switch (algo) {
          case Algorithm::kChain:
            return broadcastChain(o, c.out, c.count, c.dtype, c.root);
          case Algorithm::kDirect:
            return broadcastDirect(o, c.out, c.count, c.dtype, c.root);
          default:
            return broadcastTree(o, c.out, c.count, c.dtype, c.root);
        }
      case OpType::kReduce:
        if (algo == Algorithm::kDirect) {
          return reduceDirect(o, c.in, c.out, c.count, c.dtype, c.op, c.root);
        }
        return reduceTree(o, c.in, c.out, c.count, c.dtype, c.op, c.root);
      case OpType::kAllgather:
        if (algo == Algorithm::kDirect) return allgatherDirect(o, c.in, c.out, c.count, c.dtype);
        return allgatherRing(o, c.in, c.out, c.count, c.dtype);
      case OpType::kReduceScatter:
        if (algo == Algorithm::kDirect) {
          return reduceScatterDirect(o, c.in, c.out, c.count, c.dtype, c.op);
        }
        return reduceScatterRing(o, c.in, c.out, c.count, c.dtype, c.op);
      case OpType::kGather:
        return gatherDirect(o, c.in, c.out, c.count, c.dtype, c.root);
      case OpType::kScatter:
        return scatterDirect(o, c.in, c.out, c.count, c.dtype, c.root);
      case OpType::kAlltoall:
        return alltoallDirect(o, c.in, c.out, c.count, c.dtype);
      case OpType::kBarrier:
        return barrierDissemination(o);
      case OpType::kAlltoallv:
        return alltoallvDirect(o, c.in, c.counts, c.out, c.outCounts, c.dtype);
      case OpType::kAllgatherv:
        return allgathervDirect(o, c.in, c.out, c.counts, c.dtype);
      case OpType::kGatherv:
        return gathervDirect(o, c.in, c.out, c.counts, c.dtype, c.root);
      case OpType::kReduceScatterv:
        return reduceScattervDirect(o, c.in, c.out, c.counts, c.dtype, c.op);
      default:
        LOOM_THROW(InvalidArgumentError, "the generic engine got ", opTypeName(c.type));
    }
  }

 private:
  const GenericEngineOptions options_;
};

}  // namespace

std::unique_ptr<Engine> makeGenericEngine(const GenericEngineOptions& options) {
  return std::make_unique<GenericEngine>(options);
}

}  // namespace loom::comm
