// Every algorithm, forced through ContextOptions::algorithm and through
// CollectiveOptions::algorithm, on world sizes {2, 3, 5, 8} with counts that are split into
// many chunks (ContextOptions::chunkBytes = 4096), in place and out of place, checked in closed
// form.
// Plus the selection rules themselves (white-box: algorithms/select.h).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "algorithms/select.h"
#include "engine/engine.h"
#include "loom/comm/transport.h"
#include "sweep.h"

namespace loom::comm::testing {
namespace {

// Every Context here cuts the chunked algorithms' messages at 4 KiB, so that the counts below
// span many chunks.
ContextOptions smallChunks(Algorithm algorithm = Algorithm::kAuto) {
  ContextOptions o;
  o.chunkBytes = 4096;
  o.algorithm = algorithm;
  return o;
}

void runChunked(int size, const std::function<void(Context&)>& fn) {
  runWorld(size, fn, std::chrono::seconds(60), smallChunks());
}

TEST(Select, ContextAndCallOptions) {
  constexpr Algorithm kAuto = Algorithm::kAuto;
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 8, 2), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 64 << 20, 2), Algorithm::kRing);
  // Halving-doubling for mid sizes on power-of-two worlds from 4, the ring otherwise.
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 4 << 20, 4),
            Algorithm::kHalvingDoubling);
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 4 << 20, 8),
            Algorithm::kHalvingDoubling);
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 4 << 20, 3), Algorithm::kRing);
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 4 << 20, 2), Algorithm::kRing);
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, kAuto, 64 << 20, 4), Algorithm::kRing);
  // ContextOptions::algorithm = ring
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, kAuto, Algorithm::kRing, 8, 2), Algorithm::kRing);
  // Not implemented for broadcast: the Context's choice falls back to the automatic one.
  EXPECT_EQ(selectAlgorithm(OpType::kBroadcast, kAuto, Algorithm::kRing, 8, 2), Algorithm::kTree);
  // The call's option wins over the Context's.
  EXPECT_EQ(selectAlgorithm(OpType::kAllreduce, Algorithm::kDirect, Algorithm::kRing, 8, 2),
            Algorithm::kDirect);
  EXPECT_THROW(checkAlgorithm(OpType::kAllreduce, Algorithm::kTree), InvalidArgumentError);
  EXPECT_THROW(checkAlgorithm(OpType::kBarrier, Algorithm::kRing), InvalidArgumentError);
  EXPECT_NO_THROW(checkAlgorithm(OpType::kBarrier, kAuto));
  EXPECT_EQ(parseAlgorithm("RD"), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(parseAlgorithm("chain"), Algorithm::kChain);
  EXPECT_STREQ(algorithmName(Algorithm::kRecursiveDoubling), "rd");
}

void runAll(Checker& check, int size) {
  for (size_t count : {size_t{1}, static_cast<size_t>(size + 1), size_t{10007}}) {
    for (bool inPlace : {false, true}) {
      check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, count, inPlace, 0});
      check.allreduce({"allreduce", DType::kInt64, ReduceOp::kMax, count, inPlace, 0});
      check.allreduce({"allreduce", DType::kFloat16, ReduceOp::kAvg, count, inPlace, 0});
      check.reduceScatter({"reduce_scatter", DType::kInt32, ReduceOp::kSum, count, inPlace, 0});
      check.allgather({"allgather", DType::kFloat64, ReduceOp::kSum, count, inPlace, 0});
      check.reduce({"reduce", DType::kBFloat16, ReduceOp::kSum, count, inPlace, size - 1});
    }
    check.broadcast({"broadcast", DType::kUInt8, ReduceOp::kSum, count, true, size / 2});
    check.broadcast({"broadcast", DType::kInt64, ReduceOp::kSum, count, true, 0});
  }
}

class ForcedAlgorithm : public ::testing::TestWithParam<const char*> {};

TEST_P(ForcedAlgorithm, ThroughContextOptions) {
  for (int size : {2, 3, 5, 8}) {
    SCOPED_TRACE(detail::str("ContextOptions::algorithm ", GetParam(), " world size ", size));
    runWorld(
        size,
        [&](Context& ctx) {
          Checker check(ctx);
          runAll(check, size);
        },
        std::chrono::seconds(60), smallChunks(parseAlgorithm(GetParam())));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ForcedAlgorithm,
                         ::testing::Values("ring", "rd", "hd", "direct", "tree", "chain"));

// The ring all-reduce in place stages reduce-scatter receives in two scratch segments and
// reposts chunk c of step k + 2 into the slot of step k: counts below the world size (empty
// segments), odd counts, one and many chunks (4096-byte chunks here), world sizes with one,
// two and three reduce-scatter steps, every dtype and op, twice in a row (scratch reuse).
// The rings post every receive before its data can arrive: over TCP no chunk goes through the
// transport's unexpected-message buffers (an allocation and a second copy each), in place or
// not, while the results stay right. The reduce-scatter ring from 3 ranks posts all its
// receives up front (through a window of 4 chunks it buffered about 1 MiB per call here); the
// all-reduce ring posts its all-gather receives after its last reduce-scatter receive (posted
// first, they made reduce-scatter chunks that came early look unexpected). Chunks are above
// the transport's eager size (64 KiB), as by default: a chunk that arrives before this rank
// even entered the call, while nothing waits on its peer, stays in the socket until posted.
// (2 ranks are left out: there the paced windows still let a few chunks of one collective
// arrive while the peer waits in the one before, 0.4-1.7 MB per rank over these 8 calls.)
// A Context-wide forced algorithm (LOOM_ALGO=tree) takes the transport only for the operations
// that have it: all-reduce, which has no tree, kept the automatic choice of algorithm but lost
// the shared-memory engine. A per-call algorithm always takes the transport.
TEST(EngineChoice, AContextsForcedAlgorithmBypassesSharedMemoryOnlyWhereItApplies) {
  struct Fake final : Engine {
    Fake(Kind kind, uint32_t ops) : Engine(kind, ops) {}
    void run(const CollectiveCall&) override {}
  };
  auto generic = std::make_unique<Fake>(Engine::Kind::kGeneric, kAllCollectives);
  auto local = std::make_unique<Fake>(Engine::Kind::kArena, kAllCollectives);
  Engine* genericPtr = generic.get();
  Engine* localPtr = local.get();
  EngineSet tree(std::move(generic), std::move(local), Algorithm::kTree);
  HashStore store;
  auto ctx = Context::create(store, 0, 1);
  CollectiveOptions automatic, ring;
  ring.algorithm = Algorithm::kRing;
  const auto engineFor = [&](OpType type, const CollectiveOptions& opts) {
    return &tree.engineFor(CollectiveCall{*ctx, opts, type});
  };
  EXPECT_EQ(engineFor(OpType::kBroadcast, automatic), genericPtr);  // tree runs it
  EXPECT_EQ(engineFor(OpType::kReduce, automatic), genericPtr);
  EXPECT_EQ(engineFor(OpType::kAllreduce, automatic), localPtr);  // no tree: shared memory
  EXPECT_EQ(engineFor(OpType::kAllgather, automatic), localPtr);
  EXPECT_EQ(engineFor(OpType::kAllreduce, ring), genericPtr);  // forced by the call
}

TEST(Rings, PostEveryReceiveInTime) {
  for (int size : {3, 4}) {
    ContextOptions o;
    o.algorithm = Algorithm::kRing;
    o.chunkBytes = 128 << 10;
    o.sharedMemory = false;
    runWorld(
        size,
        [&](Context& ctx) {
          const size_t count = 256 << 10;  // 1 MiB per rank: 8 chunks per step
          std::vector<float> in(count * ctx.size()), out(count * ctx.size());
          CollectiveOptions opts;
          const uint64_t before = ctx.transport().unexpectedBytes();
          for (int round = 0; round < 4; ++round) {
            for (size_t i = 0; i < in.size(); ++i) {
              in[i] = static_cast<float>((i + ctx.rank() + round) % 7);
            }
            const bool inPlace = round % 2 == 1;
            // The value every rank contributes at index `at`, summed.
            auto want = [&](size_t at) {
              float sum = 0;
              for (int q = 0; q < ctx.size(); ++q) sum += static_cast<float>((at + q + round) % 7);
              return sum;
            };
            opts.seq = 2 * round + 1;
            float* dst = inPlace ? in.data() + ctx.rank() * count : out.data();
            reduceScatter(ctx, in.data(), dst, count, DType::kFloat32, ReduceOp::kSum, opts);
            for (size_t i = 0; i < count; i += 97) {
              ASSERT_EQ(dst[i], want(ctx.rank() * count + i)) << "reduce-scatter round " << round;
            }
            for (size_t i = 0; i < in.size(); ++i) {
              in[i] = static_cast<float>((i + ctx.rank() + round) % 7);
            }
            opts.seq = 2 * round + 2;
            float* all = inPlace ? in.data() : out.data();
            allreduce(ctx, in.data(), all, in.size(), DType::kFloat32, ReduceOp::kSum, opts);
            for (size_t i = 0; i < in.size(); i += 97) {
              ASSERT_EQ(all[i], want(i)) << "all-reduce round " << round;
            }
          }
          EXPECT_EQ(ctx.transport().unexpectedBytes() - before, 0u)
              << "rank " << ctx.rank() << " of " << ctx.size();
        },
        std::chrono::seconds(60), o);
  }
}

TEST(RingInPlace, EveryDTypeOpAndChunking) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runChunked(size, [&](Context& ctx) {
      Checker check(ctx, Algorithm::kRing);
      for (DType dtype : allDTypes()) {
        for (ReduceOp op : validOps(dtype)) {
          for (size_t count :
               {size_t{1}, static_cast<size_t>(size - 1), size_t{4097}, size_t{3 * 4096 * 4 + 5}}) {
            check.allreduce({"allreduce", dtype, op, count, true, 0});
          }
        }
      }
      check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, 200003, true, 0});
      check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, 200003, true, 0});
    });
  }
}

// Halving-doubling: world sizes that are powers of two (2, 4, 8) and not (3, 5, 6, 7: the
// fold of the extra ranks), counts below the number of blocks (empty blocks), odd counts,
// one and many chunks per exchange (4096-byte chunks here), every dtype and op (avg divides
// the owned block once), in place and out of place, twice in a row (scratch reuse).
TEST(HalvingDoubling, EveryWorldSizeDTypeOpAndChunking) {
  for (int size : {2, 3, 4, 5, 6, 7, 8}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runChunked(size, [&](Context& ctx) {
      Checker check(ctx, Algorithm::kHalvingDoubling);
      for (DType dtype : allDTypes()) {
        for (ReduceOp op : validOps(dtype)) {
          for (size_t count : {size_t{1}, static_cast<size_t>(size + 1), size_t{4097 * 3}}) {
            for (bool inPlace : {true, false}) {
              check.allreduce({"allreduce", dtype, op, count, inPlace, 0});
            }
          }
        }
      }
      check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, 200003, true, 0});
      check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kAvg, 200003, false, 0});
    });
  }
}

TEST(ForcedOption, EveryAlgorithmOfEachCollective) {
  for (int size : {3, 4}) {
    runChunked(size, [&](Context& ctx) {
      for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling,
                          Algorithm::kHalvingDoubling, Algorithm::kDirect}) {
        Checker check(ctx, a);
        check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, 10007, false, 0});
      }
      for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect}) {
        Checker check(ctx, a);
        check.reduceScatter({"reduce_scatter", DType::kFloat32, ReduceOp::kSum, 10007, true, 0});
        check.allgather({"allgather", DType::kFloat32, ReduceOp::kSum, 10007, false, 0});
      }
      for (Algorithm a : {Algorithm::kTree, Algorithm::kChain, Algorithm::kDirect}) {
        Checker check(ctx, a);
        check.broadcast({"broadcast", DType::kFloat32, ReduceOp::kSum, 10007, true, 1});
      }
      for (Algorithm a : {Algorithm::kTree, Algorithm::kDirect}) {
        Checker check(ctx, a);
        check.reduce({"reduce", DType::kInt32, ReduceOp::kProd, 10007, false, 2});
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm::testing
