// The mpi backend's correctness sweep, run under mpirun (1 to 4 ranks, see CMakeLists.txt):
// every collective of the ProcessGroup API x every dtype x every valid reduce op x counts
// {0, 1, size-1, 1000, 65539} (plus 2^20+3 for a few), in place and out of place, from every
// root, each rank filling known values (tests/comm/fill.h) and checking the closed form, as the
// comm sweeps do for the other backends. Plus the uneven collectives, the coalesced all-reduce
// and the asynchronous issue of many operations.
#include <gtest/gtest.h>

#include <numeric>

#include "mpi_test_support.h"

namespace loom::mpi_testing {
namespace {

using comm::testing::allDTypes;
using comm::testing::expectedReduce;
using comm::testing::fillValue;
using comm::testing::tolerance;
using comm::testing::validOps;

std::vector<size_t> counts() {
  const size_t p = static_cast<size_t>(world().size());
  std::vector<size_t> c = {0, 1, 1000, 65539};
  if (p - 1 > 1) c.push_back(p - 1);
  return c;
}

std::string caseName(const char* what, DType dtype, ReduceOp op, size_t count, bool inPlace,
                     int root = -1) {
  std::string s = std::string(what) + " dtype=" + dtypeName(dtype) + " op=" + reduceOpName(op) +
                  " count=" + std::to_string(count) + (inPlace ? " in-place" : " out-of-place");
  if (root >= 0) s += " root=" + std::to_string(root);
  return s;
}

void fillReduce(Bytes& buf, size_t n, DType dtype, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    setElem(buf.data(), i, dtype, fillValue(world().rank(), i, op, dtype));
  }
}

TEST(MpiSweep, Allreduce) {
  ProcessGroup& pg = world();
  const int p = pg.size();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (ReduceOp op : validOps(dtype)) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(n, dtype), out = makeBytes(n, dtype);
          fillReduce(in, n, dtype, op);
          Bytes& dst = inPlace ? in : out;
          pg.allreduce(bv(in.data(), n, dtype), bv(dst.data(), n, dtype), {.reduceOp = op})->wait();
          expectElems(
              caseName("allreduce", dtype, op, n, inPlace), dst.data(), n, dtype,
              [&](size_t i) { return expectedReduce(p, i, op, dtype); }, tolerance(op, dtype));
        }
      }
    }
  }
}

TEST(MpiSweep, AllreduceLarge) {
  ProcessGroup& pg = world();
  const size_t n = (size_t{1} << 20) + 3;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      Bytes in = makeBytes(n, dtype);
      fillReduce(in, n, dtype, op);
      pg.allreduce(bv(in.data(), n, dtype), {.reduceOp = op})->wait();
      expectElems(
          caseName("allreduce", dtype, op, n, true), in.data(), n, dtype,
          [&](size_t i) { return expectedReduce(pg.size(), i, op, dtype); }, tolerance(op, dtype));
    }
  }
}

TEST(MpiSweep, ReduceEveryRoot) {
  ProcessGroup& pg = world();
  const int p = pg.size();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (ReduceOp op : validOps(dtype)) {
        for (int root = 0; root < p; ++root) {
          for (bool inPlace : {false, true}) {
            Bytes in = makeBytes(n, dtype), out = makeBytes(n, dtype);
            fillReduce(in, n, dtype, op);
            Bytes& dst = inPlace ? in : out;
            pg.reduce(bv(in.data(), n, dtype), bv(dst.data(), n, dtype),
                      {.reduceOp = op, .root = root})
                ->wait();
            if (pg.rank() == root) {
              expectElems(
                  caseName("reduce", dtype, op, n, inPlace, root), dst.data(), n, dtype,
                  [&](size_t i) { return expectedReduce(p, i, op, dtype); }, tolerance(op, dtype));
            } else {
              // A non-root's input is left unchanged.
              expectElems(caseName("reduce (non-root input)", dtype, op, n, inPlace, root),
                          in.data(), n, dtype, [&](size_t i) {
                            return wrapped(dtype, fillValue(pg.rank(), i, op, dtype));
                          });
            }
          }
        }
      }
    }
  }
}

TEST(MpiSweep, ReduceScatter) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (ReduceOp op : validOps(dtype)) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(n * p, dtype), out = makeBytes(n, dtype);
          fillReduce(in, n * p, dtype, op);
          void* dst = inPlace ? at(in, r * n, dtype) : out.data();
          pg.reduceScatter(bv(in.data(), n * p, dtype), bv(dst, n, dtype), {.reduceOp = op})
              ->wait();
          expectElems(
              caseName("reduce_scatter", dtype, op, n, inPlace), dst, n, dtype,
              [&](size_t i) { return expectedReduce(p, r * n + i, op, dtype); },
              tolerance(op, dtype));
        }
      }
    }
  }
}

TEST(MpiSweep, BroadcastEveryRoot) {
  ProcessGroup& pg = world();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (int root = 0; root < pg.size(); ++root) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(n, dtype), out = makeBytes(n, dtype);
          if (pg.rank() == root) {
            for (size_t i = 0; i < n; ++i) setElem(in.data(), i, dtype, value(root, i));
          }
          Bytes& dst = inPlace ? in : out;
          pg.broadcast(bv(in.data(), n, dtype), bv(dst.data(), n, dtype), {.root = root})->wait();
          expectElems(caseName("broadcast", dtype, ReduceOp::kSum, n, inPlace, root), dst.data(), n,
                      dtype, [&](size_t i) { return wrapped(dtype, value(root, i)); });
        }
      }
    }
  }
}

TEST(MpiSweep, Allgather) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (bool inPlace : {false, true}) {
        Bytes in = makeBytes(n, dtype), out = makeBytes(n * p, dtype);
        void* src = inPlace ? at(out, r * n, dtype) : in.data();
        for (size_t i = 0; i < n; ++i) setElem(src, i, dtype, value(r, i));
        pg.allgather(bv(src, n, dtype), bv(out.data(), n * p, dtype))->wait();
        expectElems(caseName("allgather", dtype, ReduceOp::kSum, n, inPlace), out.data(), n * p,
                    dtype, [&](size_t i) { return wrapped(dtype, value(i / n, i % n)); });
      }
    }
  }
}

TEST(MpiSweep, GatherEveryRoot) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (int root = 0; root < p; ++root) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(n, dtype), out = makeBytes(n * p, dtype);
          void* src = inPlace && r == root ? at(out, r * n, dtype) : in.data();
          for (size_t i = 0; i < n; ++i) setElem(src, i, dtype, value(r, i));
          const BufferView outView = r == root ? bv(out.data(), n * p, dtype) : BufferView{};
          pg.gather(bv(src, n, dtype), outView, {.root = root})->wait();
          if (r != root) continue;
          expectElems(caseName("gather", dtype, ReduceOp::kSum, n, inPlace, root), out.data(),
                      n * p, dtype, [&](size_t i) { return wrapped(dtype, value(i / n, i % n)); });
        }
      }
    }
  }
}

TEST(MpiSweep, ScatterEveryRoot) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (int root = 0; root < p; ++root) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(n * p, dtype), out = makeBytes(n, dtype);
          if (r == root) {
            for (size_t i = 0; i < n * p; ++i) setElem(in.data(), i, dtype, value(root, i));
          }
          void* dst = inPlace && r == root ? at(in, r * n, dtype) : out.data();
          const BufferView inView = r == root ? bv(in.data(), n * p, dtype) : BufferView{};
          pg.scatter(inView, bv(dst, n, dtype), {.root = root})->wait();
          expectElems(caseName("scatter", dtype, ReduceOp::kSum, n, inPlace, root), dst, n, dtype,
                      [&](size_t i) { return wrapped(dtype, value(root, r * n + i)); });
        }
      }
    }
  }
}

TEST(MpiSweep, Alltoall) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t n : counts()) {
    for (DType dtype : allDTypes()) {
      for (bool inPlace : {false, true}) {
        Bytes in = makeBytes(n * p, dtype), out = makeBytes(n * p, dtype);
        for (size_t i = 0; i < n * p; ++i) setElem(in.data(), i, dtype, value(r, i));
        Bytes& dst = inPlace ? in : out;
        pg.alltoall(bv(in.data(), n * p, dtype), bv(dst.data(), n * p, dtype))->wait();
        expectElems(caseName("alltoall", dtype, ReduceOp::kSum, n, inPlace), dst.data(), n * p,
                    dtype, [&](size_t i) { return wrapped(dtype, value(i / n, r * n + i % n)); });
      }
    }
  }
}

// The uneven collectives: block j holds blockCount(base, j) elements (every third empty);
// alltoallv sends splitCount(base, r, j) from rank r to rank j.
size_t blockCount(size_t base, int j) {
  return j % 3 == 1 ? 0 : base + static_cast<size_t>(j);
}
size_t splitCount(size_t base, int r, int j) {
  return (r + 2 * j + 1) % 3 == 0 ? 0 : base + static_cast<size_t>(r + j);
}
std::vector<size_t> blocks(size_t base) {
  std::vector<size_t> c;
  for (int j = 0; j < world().size(); ++j) c.push_back(blockCount(base, j));
  return c;
}
size_t offsetOf(const std::vector<size_t>& c, int j) {
  return std::accumulate(c.begin(), c.begin() + j, size_t{0});
}
size_t totalOf(const std::vector<size_t>& c) {
  return std::accumulate(c.begin(), c.end(), size_t{0});
}
int blockOf(const std::vector<size_t>& c, size_t i) {
  int j = 0;
  while (i >= c[j]) i -= c[j++];
  return j;
}
// Element i of what rank `from` sends to rank `to`.
int64_t uneven(int from, int to, size_t i) {
  return static_cast<int64_t>((from * 31 + to * 7 + i) % 101);
}

TEST(MpiSweep, Alltoallv) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t base : {size_t{0}, size_t{1}, size_t{1000}}) {
    for (DType dtype : allDTypes()) {
      std::vector<size_t> inSplits, outSplits, equal;
      for (int j = 0; j < p; ++j) {
        inSplits.push_back(splitCount(base, r, j));
        outSplits.push_back(splitCount(base, j, r));
        equal.push_back(base + static_cast<size_t>(j == r));
      }
      // Uneven splits out of place, then in place (when this rank's totals agree: a copy of the
      // input is sent), then the same splits in and out (rank r sends base + (j == r) to rank
      // j and so receives base + (j == r) from it), in place: MPI_IN_PLACE.
      for (int form = 0; form < 3; ++form) {
        const bool sameSplits = form == 2;
        const std::vector<size_t>& ins = sameSplits ? equal : inSplits;
        const std::vector<size_t>& outs = sameSplits ? equal : outSplits;
        const bool inPlace = form >= 1 && totalOf(ins) == totalOf(outs);
        Bytes in = makeBytes(totalOf(ins), dtype), out = makeBytes(totalOf(outs), dtype);
        for (int j = 0; j < p; ++j) {
          for (size_t i = 0; i < ins[j]; ++i) {
            setElem(at(in, offsetOf(ins, j), dtype), i, dtype, uneven(r, j, i));
          }
        }
        Bytes& dst = inPlace ? in : out;
        pg.alltoallv(bv(in.data(), totalOf(ins), dtype), ins, bv(dst.data(), totalOf(outs), dtype),
                     outs)
            ->wait();
        const std::string what = caseName(sameSplits ? "alltoallv (equal splits)" : "alltoallv",
                                          dtype, ReduceOp::kSum, base, inPlace);
        expectElems(what, dst.data(), totalOf(outs), dtype, [&](size_t i) {
          const int from = blockOf(outs, i);
          return wrapped(dtype, uneven(from, r, i - offsetOf(outs, from)));
        });
      }
    }
  }
}

TEST(MpiSweep, AllgathervAndGatherv) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t base : {size_t{0}, size_t{1}, size_t{1000}}) {
    const std::vector<size_t> c = blocks(base);
    const size_t total = totalOf(c), mine = c[r];
    for (DType dtype : allDTypes()) {
      const auto want = [&](size_t i) {
        const int from = blockOf(c, i);
        return wrapped(dtype, uneven(from, from, i - offsetOf(c, from)));
      };
      for (bool inPlace : {false, true}) {
        Bytes in = makeBytes(mine, dtype), out = makeBytes(total, dtype);
        void* src = inPlace ? at(out, offsetOf(c, r), dtype) : in.data();
        for (size_t i = 0; i < mine; ++i) setElem(src, i, dtype, uneven(r, r, i));
        pg.allgatherv(bv(src, mine, dtype), bv(out.data(), total, dtype), c)->wait();
        expectElems(caseName("allgatherv", dtype, ReduceOp::kSum, base, inPlace), out.data(), total,
                    dtype, want);
      }
      for (int root = 0; root < p; ++root) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(mine, dtype), out = makeBytes(total, dtype);
          void* src = inPlace && r == root ? at(out, offsetOf(c, r), dtype) : in.data();
          for (size_t i = 0; i < mine; ++i) setElem(src, i, dtype, uneven(r, r, i));
          const BufferView outView = r == root ? bv(out.data(), total, dtype) : BufferView{};
          pg.gatherv(bv(src, mine, dtype), outView, c, {.root = root})->wait();
          if (r == root) {
            expectElems(caseName("gatherv", dtype, ReduceOp::kSum, base, inPlace, root), out.data(),
                        total, dtype, want);
          }
        }
      }
    }
  }
}

TEST(MpiSweep, ReduceScatterv) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  for (size_t base : {size_t{0}, size_t{1}, size_t{1000}}) {
    const std::vector<size_t> c = blocks(base);
    const size_t total = totalOf(c), mine = c[r], first = offsetOf(c, r);
    for (DType dtype : allDTypes()) {
      for (ReduceOp op : validOps(dtype)) {
        for (bool inPlace : {false, true}) {
          Bytes in = makeBytes(total, dtype), out = makeBytes(mine, dtype);
          fillReduce(in, total, dtype, op);
          void* dst = inPlace ? at(in, first, dtype) : out.data();
          pg.reduceScatterv(bv(in.data(), total, dtype), bv(dst, mine, dtype), c, {.reduceOp = op})
              ->wait();
          expectElems(
              caseName("reduce_scatterv", dtype, op, base, inPlace), dst, mine, dtype,
              [&](size_t i) { return expectedReduce(p, first + i, op, dtype); },
              tolerance(op, dtype));
        }
      }
    }
  }
}

// float16 / bfloat16 AVG divides every input by the size before the sum: the 16-bit sum
// overflowed where the average fits (2 ranks of 40000 in float16 gave inf).
TEST(MpiSweep, HalfAvgThatFitsDoesNotOverflow) {
  ProcessGroup& pg = world();
  const int p = pg.size();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    const double big = bf16 ? 2e38 : 40000.0;  // twice it is past the largest finite value
    const uint16_t bits = bf16 ? comm::floatToBFloat16(static_cast<float>(big))
                               : comm::floatToHalf(static_cast<float>(big));
    const size_t n = 17;
    const auto filled = [&](size_t count) { return std::vector<uint16_t>(count, bits); };
    const auto all = [&](size_t) {
      return bf16 ? comm::bfloat16ToFloat(bits) : comm::halfToFloat(bits);
    };
    std::vector<uint16_t> in = filled(n * p), out = filled(n * p);
    pg.allreduce(bv(in.data(), n, dtype), bv(out.data(), n, dtype), {.reduceOp = ReduceOp::kAvg})
        ->wait();
    expectElems("allreduce avg", out.data(), n, dtype, all);
    pg.allreduce(bv(in.data(), n, dtype), {.reduceOp = ReduceOp::kAvg})->wait();
    expectElems("allreduce avg in place", in.data(), n, dtype, all);
    in = filled(n * p);
    pg.reduce(bv(in.data(), n, dtype), bv(out.data(), n, dtype),
              {.reduceOp = ReduceOp::kAvg, .root = 0})
        ->wait();
    if (pg.rank() == 0) expectElems("reduce avg", out.data(), n, dtype, all);
    expectElems("reduce avg's input", in.data(), n, dtype, all);
    pg.reduceScatter(bv(in.data(), n * p, dtype), bv(out.data(), n, dtype),
                     {.reduceOp = ReduceOp::kAvg})
        ->wait();
    expectElems("reduce_scatter avg", out.data(), n, dtype, all);
  }
}

TEST(MpiSweep, AllreduceCoalesced) {
  ProcessGroup& pg = world();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin}) {
      for (size_t parts : {size_t{1}, size_t{3}}) {
        std::vector<Bytes> bufs;
        std::vector<BufferView> views;
        for (size_t k = 0; k < parts; ++k) {
          const size_t n = 7 + 100 * k;
          bufs.push_back(makeBytes(n, dtype));
          fillReduce(bufs.back(), n, dtype, op);
        }
        for (size_t k = 0; k < parts; ++k) views.push_back(bv(bufs[k].data(), 7 + 100 * k, dtype));
        pg.allreduceCoalesced(views, {.reduceOp = op})->wait();
        for (size_t k = 0; k < parts; ++k) {
          expectElems(
              caseName("allreduce_coalesced", dtype, op, views[k].count, true), bufs[k].data(),
              views[k].count, dtype,
              [&](size_t i) { return expectedReduce(pg.size(), i, op, dtype); },
              tolerance(op, dtype));
        }
      }
    }
  }
}

// Issue order: many operations issued before any wait complete in order with the right
// sequence numbers and results.
TEST(MpiSweep, ManyIssuedBeforeWaiting) {
  ProcessGroup& pg = world();
  const uint64_t first = pg.lastSeq() + 1;
  constexpr int kOps = 64;
  std::vector<std::vector<int32_t>> bufs(kOps, std::vector<int32_t>(33));
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < kOps; ++k) {
    for (auto& v : bufs[k]) v = pg.rank() + k;
    works.push_back(pg.allreduce(view(bufs[k].data(), bufs[k].size())));
  }
  const int p = pg.size();
  for (int k = kOps - 1; k >= 0; --k) {
    EXPECT_TRUE(works[k]->wait());
    EXPECT_EQ(works[k]->seq(), first + k);
    EXPECT_EQ(bufs[k][32], p * (p - 1) / 2 + p * k) << "allreduce #" << k;
  }
}

}  // namespace
}  // namespace loom::mpi_testing
