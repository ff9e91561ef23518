// Engine: one way of running the collectives of a Context, chosen once at Context::create.
// The shared-memory arena (every rank on this host), the hierarchical engine (shm within a
// host, the transport between hosts) and the generic engine (the algorithms of
// comm/src/algorithms over the Context's Transport) implement it; collectives.cc validates a
// call once and hands it to the engine that EngineSet::engineFor picks.
//
// Contract
// - The Context owns its EngineSet (Context::engines()); the EngineSet owns its engines, and an
//   engine owns what it runs on (the arena engines their Arena). Engines never hold the
//   Context: each call carries it.
// - run() gets a validated call with world size > 1, and blocks until this rank's part is done.
//   Errors as in collectives.h. A call of count 0 moves nothing but still meets the other ranks
//   with its signature (the generic engine's zeroCountExchange, the arena's zeroCountStep), so
//   that a rank that passed another count fails at once rather than at its deadline.
// - Thread-safety: one thread runs collectives on a Context at a time (the Context's rule);
//   abort() may be called from any thread.
// - Dispatch cost: engineFor is inline and branch-only; run() is the one virtual call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "loom/comm/collectives.h"
#include "loom/comm/tuning.h"
#include "loom/comm/types.h"

namespace loom::comm {

class Context;

// One collective as the public functions received it. Fields an operation does not take keep
// their defaults (op for broadcast, root for allreduce, in/out for barrier); broadcast passes
// its buffer as both `in` and `out`. Lives on the caller's stack for the duration of the call.
struct CollectiveCall {
  Context& ctx;
  const CollectiveOptions& opts;
  OpType type;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  // The uneven collectives' counts per rank (collectives.h): `counts` for allgatherv, gatherv
  // and reduceScatterv, and alltoallv's inCounts; `outCounts` alltoallv's. `count` is then
  // this rank's total (what it sends plus what it receives), for selection only.
  std::span<const size_t> counts{};
  std::span<const size_t> outCounts{};
};

constexpr uint32_t opBit(OpType type) {
  return uint32_t{1} << static_cast<int>(type);
}
// Every collective (send and recv are not engine business: they go straight to the transport).
constexpr uint32_t kAllCollectives =
    opBit(OpType::kAllreduce) | opBit(OpType::kBroadcast) | opBit(OpType::kReduce) |
    opBit(OpType::kAllgather) | opBit(OpType::kReduceScatter) | opBit(OpType::kGather) |
    opBit(OpType::kScatter) | opBit(OpType::kAlltoall) | opBit(OpType::kBarrier);
// The collectives with uneven counts: only the generic engine runs them.
constexpr uint32_t kUnevenCollectives = opBit(OpType::kAlltoallv) | opBit(OpType::kAllgatherv) |
                                        opBit(OpType::kGatherv) | opBit(OpType::kReduceScatterv);

class Engine {
 public:
  enum class Kind : uint8_t { kGeneric, kArena, kHierarchical };

  Engine(Kind kind, uint32_t ops) : kind_(kind), ops_(ops) {}
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Kind kind() const { return kind_; }
  // Whether run() takes `type`; the others go to the generic engine. A mask, not a virtual,
  // so that choosing an engine costs no call.
  bool implements(OpType type) const { return (ops_ & opBit(type)) != 0; }

  virtual void run(const CollectiveCall& call) = 0;
  // Makes blocked and future calls fail fast (Context::abort); `rank` is the Context's rank.
  virtual void abort(int /*rank*/, const std::string& /*reason*/) {}

 private:
  const Kind kind_;
  const uint32_t ops_;
};

// The engines of one Context: always a generic engine, and at most one local engine (arena or
// hierarchical) that runs the operations it implements unless an algorithm is forced for the
// operation, by the call (CollectiveOptions::algorithm) or by the Context
// (ContextOptions::algorithm, LOOM_ALGO): forcing an algorithm means running it over the
// transport. The Context's applies only to the operations that have it (tree: broadcast and
// reduce); the others keep their automatic choice, shared memory included.
class EngineSet {
 public:
  EngineSet(std::unique_ptr<Engine> generic, std::unique_ptr<Engine> local, Algorithm forced)
      : generic_(std::move(generic)), local_(std::move(local)), forcedOps_(opsWith(forced)) {}

  Engine& engineFor(const CollectiveCall& call) const {
    if (local_ != nullptr && call.opts.algorithm == Algorithm::kAuto &&
        (forcedOps_ & opBit(call.type)) == 0 && local_->implements(call.type)) {
      return *local_;
    }
    return *generic_;
  }

  Engine& generic() const { return *generic_; }
  // The arena or hierarchical engine; null when the ranks do not share memory.
  Engine* local() const { return local_.get(); }

  void abort(int rank, const std::string& reason) {
    if (local_ != nullptr) local_->abort(rank, reason);
    generic_->abort(rank, reason);
  }

 private:
  // The operations that have `forced` (none for kAuto): a mask, so that the choice per call
  // costs no call.
  static uint32_t opsWith(Algorithm forced) {
    uint32_t ops = 0;
    for (uint32_t bit = 0; bit < 32; ++bit) {
      if (((kAllCollectives | kUnevenCollectives) >> bit & 1u) != 0 &&
          implementsAlgorithm(static_cast<OpType>(bit), forced)) {
        ops |= uint32_t{1} << bit;
      }
    }
    return ops;
  }

  std::unique_ptr<Engine> generic_;
  std::unique_ptr<Engine> local_;
  const uint32_t forcedOps_;
};

}  // namespace loom::comm
