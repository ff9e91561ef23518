// Thread-rank sweep of the collectives with uneven counts: alltoallv, allgatherv, gatherv
// (from every root) and reduceScatterv (every op) over world sizes {1, 2, 3, 4} x base counts
// {0, 1, 1000} x every dtype, in place and out of place, one test per case
// (`Sweep/Uneven.Alltoallv/ws3_count1_int8`). The counts per rank are uneven and include
// zeros: block j holds `blockCount(base, j)` elements (0 for every third rank), and
// alltoallv's split from rank r to rank j is `splitCount(base, r, j)`. Plus the argument
// errors: a wrong number of counts, and counts that differ between two ranks.
#include <gtest/gtest.h>

#include <numeric>

#include "loom/testing/ranks.h"
#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

// Block j of the list-form collectives: every third block empty, the others base + j.
size_t blockCount(size_t base, int j) {
  return j % 3 == 1 ? 0 : base + static_cast<size_t>(j);
}
// alltoallv: elements rank r sends to rank j.
size_t splitCount(size_t base, int r, int j) {
  return (r + 2 * j + 1) % 3 == 0 ? 0 : base + static_cast<size_t>(r + j);
}
std::vector<size_t> blockCounts(size_t base, int size) {
  std::vector<size_t> counts;
  for (int j = 0; j < size; ++j) counts.push_back(blockCount(base, j));
  return counts;
}
size_t offsetOf(const std::vector<size_t>& counts, int j) {
  return std::accumulate(counts.begin(), counts.begin() + j, size_t{0});
}
size_t totalOf(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}
// Element i of what rank `from` sends to rank `to`.
int64_t value(int from, int to, size_t i) {
  return static_cast<int64_t>((from * 31 + to * 7 + i) % 101);
}
double wrapped(DType dtype, int64_t v) {
  uint8_t tmp[8];
  setElem(tmp, 0, dtype, v);
  return getElem(tmp, 0, dtype);
}

// Runs one output's element checks: they stop at the first mismatch (recorded by the
// Checker), while the rank goes on with the case's next collective so that the world stays
// in step.
void verify(const std::function<void()>& elementChecks) {
  elementChecks();
}

using Uneven = SweepTest;

Case unevenCase(const char* what, const SweepCase& p, ReduceOp op, bool inPlace, int root) {
  return {what, p.dtype, op, p.count, inPlace, root};
}

TEST_P(Uneven, Alltoallv) {
  check([&](Checker& check) {
    Context& ctx = check.ctx();
    const int rank = ctx.rank(), size = ctx.size();
    const DType dtype = param().dtype;
    std::vector<size_t> inCounts, outCounts;
    for (int j = 0; j < size; ++j) {
      inCounts.push_back(splitCount(param().count, rank, j));
      outCounts.push_back(splitCount(param().count, j, rank));
    }
    const size_t inTotal = totalOf(inCounts), outTotal = totalOf(outCounts);
    for (bool inPlace : {false, true}) {
      // In place needs equal totals; a rank whose totals differ runs out of place (a local
      // choice: its peers see the same messages either way).
      const bool local = inPlace && inTotal == outTotal;
      const Case c = unevenCase("alltoallv", param(), ReduceOp::kSum, local, 0);
      Buffer in = makeBuffer(inTotal, dtype), out = makeBuffer(outTotal, dtype);
      for (int j = 0; j < size; ++j) {
        for (size_t i = 0; i < inCounts[j]; ++i) {
          setElem(in.data(), offsetOf(inCounts, j) + i, dtype, value(rank, j, i));
        }
      }
      void* dst = local ? in.data() : out.data();
      comm::alltoallv(ctx, in.data(), inCounts, dst, outCounts, dtype, check.nextOptions());
      verify([&] {
        for (int j = 0; j < size; ++j) {
          for (size_t i = 0; i < outCounts[j]; ++i) {
            const double want = wrapped(dtype, value(j, rank, i));
            if (!check.expectElem(c, dst, offsetOf(outCounts, j) + i, want, 0)) return;
          }
        }
      });
    }
  });
}

TEST_P(Uneven, Allgatherv) {
  check([&](Checker& check) {
    Context& ctx = check.ctx();
    const int rank = ctx.rank(), size = ctx.size();
    const DType dtype = param().dtype;
    const size_t es = dtypeSize(dtype);
    const std::vector<size_t> counts = blockCounts(param().count, size);
    for (bool inPlace : {false, true}) {
      const Case c = unevenCase("allgatherv", param(), ReduceOp::kSum, inPlace, 0);
      Buffer in = makeBuffer(counts[rank], dtype), out = makeBuffer(totalOf(counts), dtype);
      uint8_t* src = inPlace ? out.data() + offsetOf(counts, rank) * es : in.data();
      for (size_t i = 0; i < counts[rank]; ++i) setElem(src, i, dtype, value(rank, 0, i));
      comm::allgatherv(ctx, src, out.data(), counts, dtype, check.nextOptions());
      verify([&] {
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < counts[r]; ++i) {
            const double want = wrapped(dtype, value(r, 0, i));
            if (!check.expectElem(c, out.data(), offsetOf(counts, r) + i, want, 0)) return;
          }
        }
      });
    }
  });
}

TEST_P(Uneven, Gatherv) {
  check([&](Checker& check) {
    Context& ctx = check.ctx();
    const int rank = ctx.rank(), size = ctx.size();
    const DType dtype = param().dtype;
    const size_t es = dtypeSize(dtype);
    const std::vector<size_t> counts = blockCounts(param().count, size);
    for (int root = 0; root < size; ++root) {
      for (bool inPlace : {false, true}) {
        const Case c = unevenCase("gatherv", param(), ReduceOp::kSum, inPlace, root);
        Buffer in = makeBuffer(counts[rank], dtype), out = makeBuffer(totalOf(counts), dtype);
        uint8_t* src =
            inPlace && rank == root ? out.data() + offsetOf(counts, rank) * es : in.data();
        for (size_t i = 0; i < counts[rank]; ++i) setElem(src, i, dtype, value(rank, root, i));
        comm::gatherv(ctx, src, rank == root ? out.data() : nullptr, counts, dtype, root,
                      check.nextOptions());
        if (rank != root) continue;
        verify([&] {
          for (int r = 0; r < size; ++r) {
            for (size_t i = 0; i < counts[r]; ++i) {
              const double want = wrapped(dtype, value(r, root, i));
              if (!check.expectElem(c, out.data(), offsetOf(counts, r) + i, want, 0)) return;
            }
          }
        });
      }
    }
  });
}

using UnevenReduce = SweepTest;

TEST_P(UnevenReduce, ReduceScatterv) {
  check([&](Checker& check) {
    Context& ctx = check.ctx();
    const int rank = ctx.rank(), size = ctx.size();
    const DType dtype = param().dtype;
    const ReduceOp rop = op();
    const size_t es = dtypeSize(dtype);
    const std::vector<size_t> counts = blockCounts(param().count, size);
    const size_t total = totalOf(counts), mine = offsetOf(counts, rank);
    for (bool inPlace : {false, true}) {
      const Case c = unevenCase("reduce_scatterv", param(), rop, inPlace, 0);
      Buffer in = makeBuffer(total, dtype), out = makeBuffer(counts[rank], dtype);
      // Element k of the whole input holds fillValue(rank, k), as the even reduce-scatter.
      for (size_t k = 0; k < total; ++k)
        setElem(in.data(), k, dtype, fillValue(rank, k, rop, dtype));
      uint8_t* dst = inPlace ? in.data() + mine * es : out.data();
      comm::reduceScatterv(ctx, in.data(), dst, counts, dtype, rop, check.nextOptions());
      verify([&] {
        for (size_t i = 0; i < counts[rank]; ++i) {
          const double want = expectedReduce(size, mine + i, rop, dtype);
          if (!check.expectElem(c, dst, i, want, tolerance(rop, dtype))) return;
        }
      });
    }
  });
}

std::vector<size_t> baseCounts(int /*size*/) {
  return {0, 1, 1000};
}
const std::vector<int> kSizes = {1, 2, 3, 4};

INSTANTIATE_TEST_SUITE_P(Sweep, Uneven, ::testing::ValuesIn(sweepCases(kSizes, baseCounts, false)),
                         sweepCaseName);

INSTANTIATE_TEST_SUITE_P(Sweep, UnevenReduce,
                         ::testing::ValuesIn(sweepCases(kSizes, baseCounts, true)), sweepCaseName);

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(UnevenErrors, WrongNumberOfCountsIsAnInvalidArgument) {
  runWorld(2, [](Context& ctx) {
    std::vector<float> buf(8);
    const std::vector<size_t> three = {1, 1, 1};
    try {
      allgatherv(ctx, buf.data(), buf.data(), three, DType::kFloat32);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_TRUE(contains(e.what(), "allgatherv")) << e.what();
      EXPECT_TRUE(contains(e.what(), "3 entries")) << e.what();
    }
    // The Context is still usable.
    const std::vector<size_t> two = {1, 2};
    allgatherv(ctx, buf.data() + (ctx.rank() == 0 ? 0 : 1), buf.data(), two, DType::kFloat32);
  });
}

// Rank 1 sends 4 elements where rank 0 expects 2: rank 0's InvalidArgumentError (the transport
// is aborted, as for any collective whose ranks disagree) names the operation, both ranks and
// both blocks, found in the signature of the first message (issue 38).
TEST(UnevenErrors, CountsThatDisagreeNameTheOpAndBothRanks) {
  std::string error;
  runWorld(
      2,
      [&](Context& ctx) {
        std::vector<float> in(8, 1.0f), out(8);
        CollectiveOptions opts;
        opts.seq = 5;
        opts.timeout = 20s;
        const std::vector<size_t> in0 = {1, 1}, out0 = {1, 2};
        try {
          if (ctx.rank() == 0) {
            alltoallv(ctx, in.data(), in0, out.data(), out0, DType::kFloat32, opts);
          } else {
            const std::vector<size_t> in1 = {4, 1}, out1 = {1, 1};
            alltoallv(ctx, in.data(), in1, out.data(), out1, DType::kFloat32, opts);
          }
        } catch (const InvalidArgumentError& e) {
          // Rank 0 receives more than it expects: the ranks' arguments disagree.
          if (ctx.rank() == 0) error = e.what();
        } catch (const IoError& e) {
          // Rank 1: rank 0 aborted; its send may or may not have finished first.
          if (ctx.rank() == 0) ADD_FAILURE() << "rank 0 failed with IoError: " << e.what();
        }
      },
      30s);
  EXPECT_TRUE(contains(error, "alltoallv#5")) << error;
  EXPECT_TRUE(contains(error, "rank 0: ")) << error;
  EXPECT_TRUE(contains(error, "rank 1 called alltoallv(dtype=float, block of 4 elements)"))
      << error;
  EXPECT_TRUE(contains(error, "rank 0 called alltoallv(dtype=float, block of 2 elements)"))
      << error;
}

}  // namespace
}  // namespace loom::comm::testing
