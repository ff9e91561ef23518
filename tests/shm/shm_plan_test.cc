// The shared-memory reductions' plan, checked without many cores (the check that runs on 2):
// - fold.h's schedule: every block of every rank folds its operands in rank order (x_0 op x_1
//   op ...), skewed or not, whatever the rotation; with rotation = rank the ranks' reads are
//   spread over the peers (at every position of a round no peer is read by more than two
//   ranks, and every rank's first read of a round is a different peer), where the plain order
//   has every rank read the same peer at once;
// - fold() on real data gives bit for bit the rank-order fold, reads every operand byte once
//   and writes every accumulator byte at each stage;
// - traffic.h's per-rank counts, for every algorithm, against the closed forms of docs/shm.md,
//   and for the reduction part against the bytes the instrumented fold really reads;
// - between thread ranks, the staged, window and cross-memory all-reduce and reduce-scatter
//   give the same bits (segments owned by ranks >= 2 included: before, the staged and
//   cross-memory paths added the owner's operand first).
// Cost: well under a second (4 thread ranks, < 1 MiB per call).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "algorithms/algorithms.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/reduce.h"
#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "shm/arena.h"
#include "shm/fold.h"
#include "shm/shm.h"
#include "shm/traffic.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

struct Step {
  size_t block;
  int stage;
};

std::vector<Step> schedule(int size, int rotation, size_t blocks, bool skew) {
  std::vector<Step> steps;
  shm::forEachFoldStep(size, rotation, blocks, skew, [&](size_t b, int s) {
    steps.push_back({b, s});
  });
  return steps;
}

TEST(FoldSchedule, EveryBlockFoldsItsOperandsInRankOrder) {
  for (int size = 2; size <= 17; ++size) {
    for (int rotation = 0; rotation < size; ++rotation) {
      for (size_t blocks : {size_t{1}, size_t{2}, size_t{5}, size_t{40}}) {
        for (bool skew : {true, false}) {
          std::vector<int> next(blocks, 1);  // the stage each block must run next
          for (const Step& s : schedule(size, rotation, blocks, skew)) {
            ASSERT_LT(s.block, blocks);
            ASSERT_EQ(s.stage, next[s.block])
                << "size " << size << " rotation " << rotation << " block " << s.block;
            ++next[s.block];
          }
          for (size_t b = 0; b < blocks; ++b) {
            ASSERT_EQ(next[b], size) << "block " << b << " did not run every stage";
          }
        }
      }
    }
  }
}

// The peers (operands other than its own) rank `rank` reads, in order, one entry per stage.
std::vector<std::vector<int>> peerReads(int size, int rank, size_t blocks, bool rotate) {
  std::vector<std::vector<int>> reads;
  for (const Step& s : schedule(size, rotate ? rank : 0, blocks, /*skew=*/true)) {
    std::vector<int> peers;
    if (s.stage == 1) {
      for (int q : {0, 1}) {
        if (q != rank) peers.push_back(q);
      }
    } else if (s.stage != rank) {
      peers.push_back(s.stage);
    }
    reads.push_back(peers);
  }
  return reads;
}

// The most ranks that read one peer at the same position of their schedules (steady state:
// every round runs every stage, so positions line up), over the positions of the middle rounds.
int mostReadersOfOnePeer(int size, bool rotate) {
  const size_t blocks = 64;
  std::vector<std::vector<std::vector<int>>> all;
  for (int r = 0; r < size; ++r) all.push_back(peerReads(size, r, blocks, rotate));
  const size_t stages = static_cast<size_t>(size - 1);
  // Rounds 0 .. stages-2 fill the pipeline (round j runs j + 1 steps): skip them.
  const size_t from = stages * (stages - 1) / 2, to = from + 8 * stages;
  int most = 0;
  for (size_t pos = from; pos < to; ++pos) {
    std::map<int, int> readers;
    for (int r = 0; r < size; ++r) {
      for (int peer : all[r][pos]) most = std::max(most, ++readers[peer]);
    }
  }
  return most;
}

TEST(FoldSchedule, RotationSpreadsTheReadsOverThePeers) {
  for (int size = 3; size <= 17; ++size) {
    // Without rotation every rank but the operand's owner reads the same peer at once.
    EXPECT_EQ(mostReadersOfOnePeer(size, /*rotate=*/false), size - 1) << "size " << size;
    EXPECT_LE(mostReadersOfOnePeer(size, /*rotate=*/true), 2) << "size " << size;
    // Each rank's first peer read of a steady-state round is (rank + 1) mod size.
    const size_t stages = static_cast<size_t>(size - 1);
    std::set<int> firsts;
    for (int r = 0; r < size; ++r) {
      const auto reads = peerReads(size, r, 64, true);
      const auto& first = reads[stages * (stages - 1) / 2];  // round stages-1's first step
      ASSERT_FALSE(first.empty());
      EXPECT_EQ(first.front(), (r + 1) % size) << "size " << size << " rank " << r;
      firsts.insert(first.front());
    }
    EXPECT_EQ(firsts.size(), static_cast<size_t>(size)) << "size " << size;
  }
}

TEST(FoldSchedule, BlocksInFlightFitTheScratch) {
  for (int size = 2; size <= 300; ++size) {
    for (size_t es : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20, size_t{1} << 30}) {
        const size_t block = shm::foldBlockElements(size, es, count, shm::Arena::kBounceBytes);
        ASSERT_GE(block, 1u);
        EXPECT_LE(block * es * (size - 1), shm::Arena::kBounceBytes) << size << " " << es;
        // Enough blocks for the wavefront's steady state whenever the minimum block allows.
        if (count * es / (size - 1) >= shm::kFoldMinBlockBytes &&
            block * es * (size - 1) <= shm::kFoldInFlightBytes) {
          EXPECT_GE((count + block - 1) / block, static_cast<size_t>(size - 1))
              << size << " " << es << " " << count;
        }
      }
    }
  }
}

// Floats whose sums depend on the order: magnitudes from 2^-20 to 2^20, both signs.
std::vector<float> awkward(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(mant(gen), expo(gen)) * (gen() % 2 ? 1.0f : -1.0f);
  return v;
}

TEST(Fold, GivesTheRankOrderBitsAndReadsEachOperandOnce) {
  const ReduceFn fn = reduceFunction(DType::kFloat32, ReduceOp::kSum);
  for (int size : {2, 3, 4, 7, 16}) {
    const size_t n = 10007;
    std::vector<std::vector<float>> x;
    for (int q = 0; q < size; ++q) x.push_back(awkward(n, 17 + q));
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) {
      float a = x[0][i] + x[1][i];
      for (int q = 2; q < size; ++q) a += x[q][i];
      want[i] = a;
    }
    for (int rank = 0; rank < size; ++rank) {
      for (bool skew : {true, false}) {
        std::vector<float> out(n, std::nanf(""));
        std::vector<size_t> readBytes(size, 0);
        size_t accBytes = 0, finishedElements = 0;
        const size_t block = shm::foldBlockElements(size, sizeof(float), n);
        shm::fold(
            fn, size, rank, n, block, skew,
            [&](int q, size_t begin, size_t m) -> const void* {
              readBytes[q] += m * sizeof(float);
              return x[q].data() + begin;
            },
            [&](size_t b) -> void* {
              accBytes += std::min(block, n - b * block) * sizeof(float);
              return out.data() + b * block;
            },
            [&](size_t, void*, size_t, size_t m) { finishedElements += m; });
        ASSERT_EQ(0, std::memcmp(out.data(), want.data(), n * sizeof(float)))
            << "size " << size << " rank " << rank << " skew " << skew;
        for (int q = 0; q < size; ++q) EXPECT_EQ(readBytes[q], n * sizeof(float));
        EXPECT_EQ(accBytes, n * sizeof(float) * (size - 1));  // one write per stage
        EXPECT_EQ(finishedElements, n);
      }
    }
  }
}

TEST(Traffic, PerRankCountsMatchTheDocumentedFormulas) {
  const size_t es = 4;
  for (int n = 2; n <= 16; ++n) {
    const size_t c = 65536 * static_cast<size_t>(n);  // divides evenly: exact closed forms
    const size_t S = c * es;
    for (int r = 0; r < n; ++r) {
      // staged all-reduce: reads (3 - 1/n) S, writes 2 S, 2 publishes, 2(n-1) waits.
      const auto ar = shm::stagedAllreduceTraffic(c, es, n, r);
      EXPECT_EQ(ar.read, 3 * S - S / n);
      EXPECT_EQ(ar.written, 2 * S);
      EXPECT_EQ(ar.publishes, 2);
      EXPECT_EQ(ar.waits, 2 * (n - 1));
      // its reduction part is what the fold reads: n operands of the own sub-slice.
      EXPECT_EQ(ar.read - (S - S / n) - S, segmentCount(c, n, r) * es * n);
      // staged reduce to rank 0: the root reads (3 - 1/n) S and writes 2 S as the all-reduce;
      // the others skip the copy out: (2 - 1/n) S and S.
      const auto rd = shm::stagedReduceTraffic(c, es, n, r, 0);
      EXPECT_EQ(rd.read, r == 0 ? 3 * S - S / n : 2 * S - S / n);
      EXPECT_EQ(rd.written, r == 0 ? 2 * S : S);
      EXPECT_EQ(rd.waits, (r == 0 ? 3 : 2) * (n - 1));
      // staged reduce-scatter (output c per rank): reads 2 n S, writes (n + 1) S.
      const auto rs = shm::stagedReduceScatterTraffic(c, es, n, r);
      EXPECT_EQ(rs.read, 2 * n * S);
      EXPECT_EQ(rs.written, (n + 1) * S);
      EXPECT_EQ(rs.waits, n - 1);
      // staged all-gather: reads and writes (n + 1) S.
      const auto ag = shm::stagedAllgatherTraffic(c, es, n, r);
      EXPECT_EQ(ag.read, (n + 1) * S);
      EXPECT_EQ(ag.written, (n + 1) * S);
      // staged broadcast: one copy per rank.
      const auto bc = shm::stagedBroadcastTraffic(c, es, n, r, 0);
      EXPECT_EQ(bc.read, S);
      EXPECT_EQ(bc.written, S);
      EXPECT_EQ(bc.waits, r == 0 ? n - 1 : 1);
      // window all-reduce: reads (2 - 1/n) S, writes S.
      const auto wa = shm::windowAllreduceTraffic(c, es, n, r);
      EXPECT_EQ(wa.read, 2 * S - S / n);
      EXPECT_EQ(wa.written, S);
      EXPECT_EQ(wa.waits, 2 * (n - 1));
      // cross-memory all-reduce: reads (3 - 2/n) S, writes (2 - 1/n) S.
      const auto cm = shm::crossMemoryAllreduceTraffic(c, es, n, r);
      EXPECT_EQ(cm.read, 3 * S - 2 * (S / n));
      EXPECT_EQ(cm.written, 2 * S - S / n);
      EXPECT_EQ(cm.waits, 3 * (n - 1));
      // window reduce-scatter: reads n S, writes S; window all-gather: (n-1) S each in place.
      const auto wr = shm::windowReduceScatterTraffic(c, es, n, r);
      EXPECT_EQ(wr.read, n * S);
      EXPECT_EQ(wr.written, S);
      const auto wg = shm::windowAllgatherTraffic(c, es, n, /*inPlace=*/true);
      EXPECT_EQ(wg.read, (n - 1) * S);
      EXPECT_EQ(wg.written, (n - 1) * S);
      // window reduce to rank 1: the root reads S, a non-root (1 + 1/n) S, each writes S/n;
      // with the root's output outside any window the root reads n S and writes S alone.
      const auto wd = shm::windowReduceTraffic(c, es, n, r, 1, true);
      EXPECT_EQ(wd.read, r == 1 ? S : S + S / n);
      EXPECT_EQ(wd.written, S / n);
      EXPECT_EQ(wd.waits, 2 * (n - 1));
      const auto wdAlone = shm::windowReduceTraffic(c, es, n, r, 1, false);
      EXPECT_EQ(wdAlone.read, r == 1 ? n * S : 0);
      EXPECT_EQ(wdAlone.written, r == 1 ? S : 0);
      // window broadcast: unassisted S per receiver; assisted (n-1)/n S per rank, root too.
      const auto wb = shm::windowBroadcastTraffic(c, es, n, r, 1, false);
      EXPECT_EQ(wb.read, r == 1 ? 0 : S);
      const auto wba = shm::windowBroadcastTraffic(c, es, n, r, 1, true);
      EXPECT_EQ(wba.read, S - S / n);
      EXPECT_EQ(wba.written, S - S / n);
    }
    // Assisted broadcast, uneven: the root's writes and the receivers' own copies together
    // give every receiver every byte once.
    for (size_t odd : {size_t{7}, size_t{1000003}}) {
      const auto root = shm::windowBroadcastTraffic(odd, es, n, 0, 0, true);
      size_t rootWrites = 0;
      for (int r = 1; r < n; ++r) {
        const auto rx = shm::windowBroadcastTraffic(odd, es, n, r, 0, true);
        const size_t fromRoot = segmentCount(odd, n, r) * es;  // receiver r is place r here
        rootWrites += fromRoot;
        EXPECT_EQ(rx.written + fromRoot, odd * es) << "receiver " << r;
      }
      EXPECT_EQ(root.written, rootWrites);
      // The window reduce's segments fill the root's output once.
      size_t reduced = 0;
      for (int r = 0; r < n; ++r)
        reduced += shm::windowReduceTraffic(odd, es, n, r, 0, true).written;
      EXPECT_EQ(reduced, odd * es);
    }
    // Uneven splits: summed over the ranks, the reductions read every operand byte once.
    const size_t odd = 1000003;
    size_t reduceRead = 0;
    for (int r = 0; r < n; ++r) {
      const auto ar = shm::stagedAllreduceTraffic(odd, es, n, r);
      const size_t own = segmentCount(odd, n, r) * es;
      reduceRead += ar.read - (odd * es - own) - odd * es;
    }
    EXPECT_EQ(reduceRead, odd * es * n);
  }
}

// ---- the three paths give the same bits ----

enum class Path { kStaged, kWindow, kCrossMemory };

// Runs an in-place float all-reduce (sum, then avg), a reduce-scatter out of place and in
// place, and a reduce to the last rank out of place and in place over `size` thread ranks on
// `path`, inputs awkward(seed = 1000 + rank); returns every rank's results, in that order.
std::vector<std::vector<float>> runPath(Path path, int size, size_t count) {
  HashStore store;
  std::vector<std::vector<float>> results(size);
  loom::testing::runThreadRanks(size, [&](int rank) {
    ContextOptions o;
    o.host = "127.0.0.1";
    o.timeout = 30s;
    o.shmWindowMinBytes = 1;
    o.shmSingleCopy = path == Path::kCrossMemory ? ShmSingleCopy::kOn : ShmSingleCopy::kOff;
    auto ctx = Context::create(store, rank, size, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena between thread ranks");
    if (path == Path::kWindow) LOOM_CHECK(arena->windows(), arena->windowsFailure());
    if (path == Path::kCrossMemory) LOOM_CHECK(arena->singleCopy(), arena->singleCopyFailure());
    const size_t bytes = count * size * sizeof(float);
    std::shared_ptr<Window> win;
    std::vector<float> plain;
    float* buf;
    if (path == Path::kWindow) {
      win = Window::allocate(bytes + count * sizeof(float));
      buf = static_cast<float*>(win->data());
    } else {
      plain.resize(count * size + count);
      buf = plain.data();
    }
    CollectiveOptions opts;
    std::vector<float>& got = results[rank];
    const auto in = awkward(count * size, 1000 + rank);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::memcpy(buf, in.data(), count * sizeof(float));
      ++opts.seq;
      allreduce(*ctx, buf, buf, count, DType::kFloat32, op, opts);
      got.insert(got.end(), buf, buf + count);
    }
    std::memcpy(buf, in.data(), bytes);
    float* out = buf + count * size;
    ++opts.seq;
    reduceScatter(*ctx, buf, out, count, DType::kFloat32, ReduceOp::kSum, opts);
    got.insert(got.end(), out, out + count);
    // In place: the output is the rank's own slice of the input (ranks >= 2 then fold through
    // the bounce buffer on the window and cross-memory paths).
    std::memcpy(buf, in.data(), bytes);
    float* own = buf + rank * count;
    ++opts.seq;
    reduceScatter(*ctx, buf, own, count, DType::kFloat32, ReduceOp::kSum, opts);
    got.insert(got.end(), own, own + count);
    // The rooted reduce to the last rank, out of place and in place (on the window path every
    // rank writes its segment into the root's window; the cross-memory path stages it).
    std::memcpy(buf, in.data(), count * sizeof(float));
    ++opts.seq;
    reduce(*ctx, buf, out, count, DType::kFloat32, ReduceOp::kSum, size - 1, opts);
    if (rank == size - 1) got.insert(got.end(), out, out + count);
    ++opts.seq;
    reduce(*ctx, buf, buf, count, DType::kFloat32, ReduceOp::kSum, size - 1, opts);
    if (rank == size - 1) got.insert(got.end(), buf, buf + count);
  });
  return results;
}

TEST(ShmPaths, StagedWindowAndCrossMemoryGiveTheSameBits) {
  const int size = 4;
  const size_t count = 100003;  // > kSmallBytes: the split path; segments of uneven size
  const auto staged = runPath(Path::kStaged, size, count);
  // The rank-order fold, computed here.
  std::vector<std::vector<float>> in;
  for (int q = 0; q < size; ++q) in.push_back(awkward(count * size, 1000 + q));
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < count; ++i) {
      float sum = in[0][i] + in[1][i];
      for (int q = 2; q < size; ++q) sum += in[q][i];
      ASSERT_EQ(std::memcmp(&staged[r][i], &sum, 4), 0) << "staged sum, rank " << r << " at " << i;
      float rs = in[0][r * count + i] + in[1][r * count + i];
      for (int q = 2; q < size; ++q) rs += in[q][r * count + i];
      ASSERT_EQ(std::memcmp(&staged[r][2 * count + i], &rs, 4), 0)
          << "staged reduce-scatter, rank " << r << " at " << i;
      ASSERT_EQ(std::memcmp(&staged[r][3 * count + i], &rs, 4), 0)
          << "staged reduce-scatter in place, rank " << r << " at " << i;
      if (r == size - 1) {
        ASSERT_EQ(std::memcmp(&staged[r][4 * count + i], &sum, 4), 0) << "reduce at " << i;
        ASSERT_EQ(std::memcmp(&staged[r][5 * count + i], &sum, 4), 0) << "reduce in place at " << i;
      }
    }
  }
  for (Path path : {Path::kWindow, Path::kCrossMemory}) {
    const auto other = runPath(path, size, count);
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(other[r].size(), staged[r].size());
      for (size_t i = 0; i < staged[r].size(); ++i) {
        ASSERT_EQ(std::memcmp(&other[r][i], &staged[r][i], 4), 0)
            << (path == Path::kWindow ? "window" : "cross-memory") << " rank " << r << " at " << i
            << " ("
            << (i < count       ? "sum"
                : i < 2 * count ? "avg"
                : i < 4 * count ? "reduce-scatter"
                                : "reduce")
            << ")";
      }
    }
  }
}

}  // namespace
}  // namespace loom::comm::testing
