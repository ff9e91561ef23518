// The reproducible collectives (loom/comm/reproducible.h): the data movement around the
// arithmetic of reproducible_accumulator.h. The paths, by world size n, transport and size:
// - pair (n = 2): SUM is the ordinary collective's own addition (one IEEE operation per element
//   is the correctly rounded sum); the other forms move the raw values (over a shared arena its
//   staged collective, else all-gather, gather, all-to-all) and each rank adds the pairs itself
//   (repro::addPairs);
// - arena (n >= 3, every rank on one host): the staged collective of shm_rows.cc, each rank
//   reducing the n rows of its sub-slice exactly, at every size (up to 16 KiB every rank reduces
//   the whole buffer in one step, as the ordinary small all-reduce);
// - over messages, by size:
//   - gathered (all-reduce and reduce at the one-pass sizes, up to 13 float32 ranks): every
//     rank's raw values through one uint8 MAX all-reduce of n slots, each rank reduces the n rows;
//   - one pass (the other small calls): every value becomes a full accumulator (`words` int64
//     per element), the ranks add them with int64 SUM through the ordinary collective of the same
//     kind, and each rank decodes its own elements;
//   - exchange (larger calls): an all-to-all brings each block's raw values to the rank that owns
//     it, which reduces the n rows exactly by itself (the double sums, the windowed arithmetic,
//     then full accumulators for the elements the window leaves undecided), and an all-gather
//     (gather) returns the results; reduce-scatter stops after the reduction.
// Every path but one-pass reduces whole rows locally, so a call is one or two collectives per
// chunk and nothing is decided across ranks after the data moved.
#include "loom/comm/reproducible.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "ordinary_reductions.h"
#include "reproducible_accumulator.h"
#include "shm/shm.h"
#include "shm/shm_collectives.h"

namespace loom::comm {

namespace {

using repro::Format;

enum class Kind : uint8_t { kAllreduce, kReduce, kReduceScatter };

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kReduce:
      return "reduce";
    default:
      return "reduce_scatter";
  }
}

bool onePass(const Format& f, size_t total) {
  return total * f.fullWords() * sizeof(int64_t) <= kReproducibleOnePassBytes;
}

struct Call {
  Context& ctx;
  Kind kind;
  const void* in;
  void* out;
  size_t total;                    // input elements
  std::span<const size_t> counts;  // reduce-scatter's blocks; empty otherwise
  DType dtype;
  const Format& f;
  int root;
  int divisor;
  CollectiveOptions inner;   // the caller's options, mode off
  CollectiveOptions helper;  // the same with the automatic algorithm (the data movement)

  size_t ownCount() const {
    if (kind == Kind::kReduceScatter) return counts[ctx.rank()];
    if (kind == Kind::kReduce && ctx.rank() != root) return 0;
    return total;
  }

  // Adds every rank's `words`-word int64 integers (the one-pass accumulators): in holds
  // them for `elements` elements (blocks in rank order, `blocks[j]` elements each for
  // reduce-scatter), result receives this rank's own block (all of them for all-reduce, the
  // root's for reduce).
  void addIntegers(const void* in, void* result, size_t elements, std::span<const size_t> blocks,
                   int words) const {
    constexpr DType type = DType::kInt64;
    switch (kind) {
      case Kind::kAllreduce:
        allreduce(ctx, in, result, elements * words, type, ReduceOp::kSum, inner);
        break;
      case Kind::kReduce:
        reduce(ctx, in, result, elements * words, type, ReduceOp::kSum, root, inner);
        break;
      case Kind::kReduceScatter: {
        // Even blocks take the even reduce-scatter, with the caller's algorithm.
        if (std::all_of(blocks.begin(), blocks.end(), [&](size_t b) { return b == blocks[0]; })) {
          reduceScatter(ctx, in, result, blocks[0] * words, type, ReduceOp::kSum, inner);
          break;
        }
        std::vector<size_t> wordCounts(blocks.begin(), blocks.end());
        for (auto& c : wordCounts) c *= words;
        reduceScatterv(ctx, in, result, wordCounts, type, ReduceOp::kSum, helper);
        break;
      }
    }
  }
};

// Scratch kept between calls (per thread: a Context runs on one thread at a time), never
// cleared: every call writes what it reads. Buffers above kKeptScratchBytes are released when the
// call ends, so that one large reduction does not pin its scratch for the thread's life.
constexpr size_t kKeptScratchBytes = size_t{64} << 20;

template <typename T>
T* scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

struct Scratch {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> sums;
  std::vector<unsigned char> gathered, gatheredSums;  // raw rows and their results
  std::vector<uint8_t> rankBytes;
  std::vector<int64_t> full, fullSums;  // full accumulators and their sums
  std::vector<unsigned char> padded;    // the exchange's padded chunk and its result
  std::vector<unsigned char> compact;   // the rows (and results) of the elements it leaves
};

class ScratchLease {
 public:
  ScratchLease() {
    thread_local Scratch kept;
    s_ = &kept;
  }
  ~ScratchLease() {
    release(s_->bytes);
    release(s_->sums);
    release(s_->gathered);
    release(s_->gatheredSums);
    release(s_->rankBytes);
    release(s_->full);
    release(s_->fullSums);
    release(s_->padded);
    release(s_->compact);
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch& operator*() const { return *s_; }

 private:
  template <typename T>
  static void release(std::vector<T>& v) {
    if (v.capacity() * sizeof(T) > kKeptScratchBytes) std::vector<T>().swap(v);
  }
  Scratch* s_;
};

// The exact reduction of element i of `inputs` (every rank's values, in one process) with full
// accumulators (`one`, `sum`: f.fullWords() words of scratch).
void reduceElementFull(const Format& f, std::span<const void* const> inputs, size_t i, int divisor,
                       int64_t* one, int64_t* sum, void* out, size_t at) {
  std::fill(sum, sum + f.fullWords(), 0);
  for (const void* in : inputs) {
    repro::encodeFull(f, repro::loadBits(f, in, i), one);
    for (int w = 0; w < f.fullWords(); ++w) sum[w] += one[w];
  }
  repro::storeBits(f, out, at, repro::decodeFull(f, sum, static_cast<int>(inputs.size()), divisor));
}

// The windowed arithmetic over `inputs` in one process: the max of the exponent bytes, the sum of
// the windows, the decode into out; undecided elements are appended to `undecided` (out left
// alone there).
void reduceRowsWindowed(const Format& f, std::span<const void* const> inputs, size_t count,
                        int divisor, Scratch& s, void* out, std::vector<size_t>& undecided) {
  const int ranks = static_cast<int>(inputs.size());
  uint8_t* bytes = scratch(s.bytes, count);
  uint8_t* rankBytes = scratch(s.rankBytes, count);
  std::fill(bytes, bytes + count, 0);
  for (const void* in : inputs) {
    repro::exponentBytes(f, in, count, rankBytes);
    repro::maxBytes(bytes, rankBytes, count);
  }
  const size_t words = count * f.windowDigits;
  int64_t* sums = scratch(s.sums, words);
  // The first row's digits are the sums' start; every other row is encoded and added in one pass.
  repro::encodeWindows(f, inputs[0], count, bytes, sums);
  for (size_t r = 1; r < inputs.size(); ++r) {
    repro::encodeWindows(f, inputs[r], count, bytes, sums, true);
  }
  repro::decodeWindows(f, sums, bytes, count, ranks, divisor, out, 0, undecided);
}

// out[i] = the exact reduction of rows[r][i] over the n rows (rank order, count elements each):
// the double sums first (float32, float16, bfloat16), then the window and full accumulators
// for what they leave.
void reduceRowsExact(const Format& f, std::span<const void* const> inputs, size_t count,
                     int divisor, Scratch& s, void* out) {
  const int n = static_cast<int>(inputs.size());
  if (repro::doubleSumApplies(f, n, divisor)) {
    // float32, float16, bfloat16 (and float64 in pairs of doubles): the elements whose values
    // span few binades add exactly in double; the rest (wide spans, infinities, NaN) go through the
    // windows below, gathered into compact rows.
    std::vector<size_t> rest;
    repro::reduceRowsDouble(f, inputs, count, divisor, out, rest);
    if (rest.empty()) return;
    const auto windowsOfRest = [&]<typename T>(T*) {
      const size_t m = rest.size();
      auto* compact = reinterpret_cast<T*>(scratch(s.compact, (n + 1) * m * sizeof(T)));
      std::vector<const void*> rowsOfRest(n);
      for (int r = 0; r < n; ++r) {
        const auto* row = static_cast<const T*>(inputs[r]);
        T* to = compact + r * m;
        for (size_t k = 0; k < m; ++k) to[k] = row[rest[k]];
        rowsOfRest[r] = to;
      }
      T* results = compact + n * m;
      std::vector<size_t> undecided;
      reduceRowsWindowed(f, rowsOfRest, m, divisor, s, results, undecided);
      int64_t* acc = scratch(s.full, 2 * f.fullWords());
      for (size_t i : undecided) {
        reduceElementFull(f, rowsOfRest, i, divisor, acc, acc + f.fullWords(), results, i);
      }
      auto* to = static_cast<T*>(out);
      for (size_t k = 0; k < m; ++k) to[rest[k]] = results[k];
    };
    if (f.bytes == 8) {
      windowsOfRest(static_cast<uint64_t*>(nullptr));
    } else if (f.bytes == 4) {
      windowsOfRest(static_cast<uint32_t*>(nullptr));
    } else {
      windowsOfRest(static_cast<uint16_t*>(nullptr));
    }
    return;
  }
  std::vector<size_t> undecided;
  reduceRowsWindowed(f, inputs, count, divisor, s, out, undecided);
  if (undecided.empty()) return;
  int64_t* acc = scratch(s.full, 2 * f.fullWords());
  for (size_t i : undecided) {
    reduceElementFull(f, inputs, i, divisor, acc, acc + f.fullWords(), out, i);
  }
}

// The same over n contiguous rows (rank order, count elements each).
void reduceRowsExact(const Format& f, const unsigned char* rows, int n, size_t count, int divisor,
                     Scratch& s, void* out) {
  std::vector<const void*> inputs(n);
  for (int r = 0; r < n; ++r) inputs[r] = rows + r * count * f.bytes;
  reduceRowsExact(f, inputs, count, divisor, s, out);
}

// The gathered path replaces the one-pass path of all-reduce and reduce where a rank's raw value
// is smaller than its full accumulator (n * f.bytes < 8 * f.fullWords(): float32 up to 13 ranks,
// float64 up to 41). Above the one-pass sizes the windowed path is faster: on 2 ranks over
// shared memory a gathered 4 KiB all-reduce took 14 us against the windows' 10.5 (2 vCPUs).
constexpr int kMaxGatherRanks = 64;
bool gathers(const Call& c) {
  const size_t n = static_cast<size_t>(c.ctx.size());
  return c.kind != Kind::kReduceScatter && n <= static_cast<size_t>(kMaxGatherRanks) &&
         n * c.f.bytes < c.f.fullWords() * sizeof(int64_t) && onePass(c.f, c.total);
}

// Small all-reduce and reduce: every rank's raw values in slot r of a zero buffer, the slots
// combined with uint8 MAX (every byte is max(0, b) = b: a gather), then the rows reduced exactly
// where the result is wanted.
void runGathered(const Call& c) {
  const Format& f = c.f;
  const int n = c.ctx.size();
  const size_t row = c.total * f.bytes;
  const ScratchLease lease;
  Scratch& s = *lease;
  unsigned char* slots = scratch(s.gathered, n * row);
  std::memset(slots, 0, n * row);
  std::memcpy(slots + c.ctx.rank() * row, c.in, row);
  unsigned char* rows = slots;
  if (c.kind == Kind::kAllreduce) {
    allreduce(c.ctx, slots, slots, n * row, DType::kUInt8, ReduceOp::kMax, c.inner);
  } else {
    rows = scratch(s.gatheredSums, n * row);
    reduce(c.ctx, slots, rows, n * row, DType::kUInt8, ReduceOp::kMax, c.root, c.inner);
    if (c.ctx.rank() != c.root) return;
  }
  reduceRowsExact(f, rows, n, c.total, c.divisor, s, c.out);
}

// Two ranks, where the ordinary collective's own addition is the answer: for two values, one
// IEEE addition in round-to-nearest is the correctly rounded sum, whatever the order, and every
// algorithm over two ranks adds each pair once (the ranks tests check every one against the exact
// reference). So SUM runs the ordinary collective, in the default floating-point environment
// (set here for this thread; Loom's copy helpers run in it), and makes its NaNs canonical.
// AVG of an all-reduce halves the sums: exact, or the one rounding of an exact sum
// (reproducible_pair.cc), except where the sum of two finite values overflowed. Those elements
// are infinite sums, the same list on both ranks (their sums are the same bits); only when there
// is one do the ranks exchange their inputs from repro::overflowThreshold up (listed before the
// call, which may overwrite them) at those elements, and add the pairs that were both finite.
// float16 AVG (threshold 16: too many candidates to list), reduce's and reduce-scatter's AVG
// take the exchange of raw values below.
bool ordinaryAddsPairs(const Call& c) {
  if (c.divisor == 1) return true;
  return c.kind == Kind::kAllreduce && !(c.f.bytes == 2 && c.f.precision == 11);
}

void runOrdinaryPair(const Call& c) {
  const Format& f = c.f;
  std::vector<std::pair<size_t, uint64_t>> candidates;
  if (c.divisor != 1) repro::overflowCandidates(f, c.in, c.total, candidates);
  {
    const repro::DefaultFloatEnvironment environment;
    const OrdinaryReductions ordinary;
    // The public entry validated the call: straight to the engine.
    switch (c.kind) {
      case Kind::kAllreduce:
        runValidatedOrdinary(c.ctx, OpType::kAllreduce, c.in, c.out, c.total, c.dtype,
                             ReduceOp::kSum, 0, c.inner);
        break;
      case Kind::kReduce:
        runValidatedOrdinary(c.ctx, OpType::kReduce, c.in, c.out, c.total, c.dtype, ReduceOp::kSum,
                             c.root, c.inner);
        break;
      case Kind::kReduceScatter:
        if (c.counts[0] == c.counts[1]) {
          runValidatedOrdinary(c.ctx, OpType::kReduceScatter, c.in, c.out, c.counts[0], c.dtype,
                               ReduceOp::kSum, 0, c.inner);
        } else {
          reduceScatterv(c.ctx, c.in, c.out, c.counts, c.dtype, ReduceOp::kSum, c.helper);
        }
        break;
    }
  }
  if (c.divisor == 1) {
    repro::canonicalNans(f, c.out, c.ownCount());
    return;
  }
  std::vector<size_t> infinite;
  repro::halveSums(f, c.out, c.total, infinite);
  if (infinite.empty()) return;
  // This rank's candidates at the infinite sums, as (index, bits) int64 pairs; both ranks'.
  std::vector<int64_t> mine;
  size_t k = 0;
  for (const auto& [i, bits] : candidates) {
    while (k < infinite.size() && infinite[k] < i) ++k;
    if (k < infinite.size() && infinite[k] == i) {
      mine.push_back(static_cast<int64_t>(i));
      mine.push_back(static_cast<int64_t>(bits));
    }
  }
  std::array<int64_t, 2> sizes{};
  const auto size = static_cast<int64_t>(mine.size());
  allgather(c.ctx, &size, sizes.data(), 1, DType::kInt64, c.helper);
  const std::array<size_t, 2> counts{static_cast<size_t>(sizes[0]), static_cast<size_t>(sizes[1])};
  std::vector<int64_t> both(counts[0] + counts[1]);
  allgatherv(c.ctx, mine.data(), both.data(), counts, DType::kInt64, c.helper);
  // Indices both ranks listed: two finite values whose sum overflowed; the average is finite.
  const int64_t* a = both.data();
  const int64_t* b = both.data() + counts[0];
  for (size_t x = 0, y = 0; x < counts[0] && y < counts[1];) {
    if (a[x] < b[y]) {
      x += 2;
    } else if (b[y] < a[x]) {
      y += 2;
    } else {
      const auto i = static_cast<size_t>(a[x]);
      uint64_t pair[2] = {static_cast<uint64_t>(a[x + 1]), static_cast<uint64_t>(b[y + 1])};
      unsigned char values[2][8];
      repro::storeBits(f, values[0], 0, pair[0]);
      repro::storeBits(f, values[1], 0, pair[1]);
      unsigned char result[8];
      repro::addPairs(f, values[0], values[1], 1, true, result);
      repro::storeBits(f, c.out, i, repro::loadBits(f, result, 0));
      x += 2;
      y += 2;
    }
  }
}

// Two ranks, the other forms: the raw values travel and each rank adds the pair itself
// (repro::addPairs: for two values, one IEEE operation in round-to-nearest is the correctly rounded
// sum, and it commutes). All-reduce: an all-gather per chunk; reduce: a gather to the root;
// reduce-scatter: an all-to-all of the blocks. Each rank sends what the default collective sends
// over two ranks (its S, or its peer's block), in one collective per chunk, and no integer format
// is made. Chunks of kPairChunkBytes of one rank's input bound the scratch (two rows of a chunk).
constexpr size_t kPairChunkBytes = size_t{4} << 20;

bool runArenaRows(const Call& c, const shm::RowsReducer& reduce);  // below

void runPair(const Call& c) {
  const Format& f = c.f;
  const bool average = c.divisor == 2;
  // Over a shared arena, the staged collective of the exchange with the pairs' arithmetic: each
  // rank adds half of the pairs, straight from the two slots, and copies the other half out.
  const shm::RowsReducer pairs = [&](std::span<const void* const> rows, size_t n, void* out) {
    repro::addPairs(f, rows[0], rows[1], n, average, out);
  };
  if (runArenaRows(c, pairs)) return;
  const ScratchLease lease;
  Scratch& s = *lease;
  const auto* in = static_cast<const unsigned char*>(c.in);
  auto* out = static_cast<unsigned char*>(c.out);
  const size_t width = static_cast<size_t>(f.bytes);
  if (c.kind == Kind::kReduceScatter) {
    const size_t mine = c.counts[c.ctx.rank()] * width;
    const std::array<size_t, 2> sent{c.counts[0] * width, c.counts[1] * width};
    const std::array<size_t, 2> received{mine, mine};
    unsigned char* rows = scratch(s.gathered, std::max<size_t>(2 * mine, 1));
    alltoallv(c.ctx, in, sent, rows, received, DType::kUInt8, c.helper);
    repro::addPairs(f, rows, rows + mine, c.counts[c.ctx.rank()], average, out);
    return;
  }
  const size_t chunk = kPairChunkBytes / width;
  const bool adds = c.kind == Kind::kAllreduce || c.ctx.rank() == c.root;
  for (size_t begin = 0; begin < c.total; begin += chunk) {
    const size_t n = std::min(chunk, c.total - begin), bytes = n * width;
    unsigned char* rows = scratch(s.gathered, 2 * bytes);
    if (c.kind == Kind::kAllreduce) {
      allgather(c.ctx, in + begin * width, rows, bytes, DType::kUInt8, c.helper);
    } else {
      gather(c.ctx, in + begin * width, rows, bytes, DType::kUInt8, c.root, c.helper);
    }
    if (adds) repro::addPairs(f, rows, rows + bytes, n, average, out + begin * width);
  }
}

// Three ranks and more over messages, above the gathered sizes (exchange): the raw values of each
// element go to the one rank that reduces it, that rank reduces them alone and exactly, and the
// results go back. All-reduce: per chunk, an all-to-all gives rank r every rank's values of block
// r, rank r reduces those n rows locally (the windowed arithmetic, then full accumulators for what
// the window leaves undecided: no second round on the wire), and an all-gather returns every
// block's result to every rank. Reduce: the same with a gather to the root. Reduce-scatter: the
// all-to-all of the caller's blocks and the local reduction. Each rank sends (n-1)/n of its input
// and (n-1)/n of the result, a ring all-reduce's bytes, in two collectives per chunk. A chunk's
// block on each rank is at most kExchangeBlockElements, fewer for large n, so that the n rows of
// a block stay within kExchangeRowsBytes of scratch.
constexpr size_t kExchangeBlockElements = 65536;
constexpr size_t kExchangeRowsBytes = size_t{4} << 20;

// Where every rank shares the Context's arena (the arena engine would run the data movement),
// the exchange's all-to-all, local reduction and all-gather (and, at small sizes, the gathered
// and one-pass paths) are one staged collective
// (shm::allreduceRows and its siblings): every rank stages its input once, rank r reduces
// sub-slice r straight from every rank's slot, and the others copy the results out. That saves
// the all-to-all's copy out, the all-gather's staging and a synchronization per chunk. Uneven
// reduce-scatter (an all-to-all-v) keeps the exchange. False when the arena does not apply.
// `reduce` reduces the rows: the exchange's reduceRowsExact, or the pair's addPairs (runPair).
bool runArenaRows(const Call& c, const shm::RowsReducer& reduce) {
  const OpType type = c.kind == Kind::kAllreduce ? OpType::kAllreduce
                      : c.kind == Kind::kReduce  ? OpType::kReduce
                                                 : OpType::kReduceScatter;
  shm::Arena* arena = shm::arenaFor(c.ctx, type, c.helper);
  if (arena == nullptr) return false;
  const ReduceOp op = c.divisor == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
  switch (c.kind) {
    case Kind::kAllreduce:
      shm::allreduceRows(*arena, c.helper, c.in, c.out, c.total, c.dtype, op, reduce);
      return true;
    case Kind::kReduce:
      shm::reduceRows(*arena, c.helper, c.in, c.out, c.total, c.dtype, op, c.root, reduce);
      return true;
    case Kind::kReduceScatter: {
      const size_t mine = c.counts[c.ctx.rank()];
      if (!std::all_of(c.counts.begin(), c.counts.end(), [&](size_t k) { return k == mine; })) {
        return false;
      }
      shm::reduceScatterRows(*arena, c.helper, c.in, c.out, mine, c.dtype, op, reduce);
      return true;
    }
  }
  return false;
}

// Three ranks and more over a shared arena, at every size: the staged collective with the exact
// reduction of the rows (its small path, every rank reducing the whole buffer from every slot in
// one step, moves what the ordinary small all-reduce moves). False when the arena does not apply.
bool runArenaExact(const Call& c) {
  const ScratchLease lease;
  Scratch& s = *lease;
  const shm::RowsReducer exact = [&](std::span<const void* const> rows, size_t n, void* out) {
    reduceRowsExact(c.f, rows, n, c.divisor, s, out);
  };
  return runArenaRows(c, exact);
}

// The exchange over messages (runArenaExact did not apply).
void runExchange(const Call& c) {
  const Format& f = c.f;
  const int n = c.ctx.size(), rank = c.ctx.rank();
  const size_t width = static_cast<size_t>(f.bytes);
  const ScratchLease lease;
  Scratch& s = *lease;
  const auto* in = static_cast<const unsigned char*>(c.in);
  auto* out = static_cast<unsigned char*>(c.out);
  if (c.kind == Kind::kReduceScatter) {
    const size_t mine = c.counts[rank];
    unsigned char* rows = scratch(s.gathered, std::max<size_t>(n * mine * width, 1));
    if (std::all_of(c.counts.begin(), c.counts.end(), [&](size_t k) { return k == mine; })) {
      alltoall(c.ctx, in, rows, mine * width, DType::kUInt8, c.helper);
    } else {
      std::vector<size_t> sent(n), received(n, mine * width);
      for (int j = 0; j < n; ++j) sent[j] = c.counts[j] * width;
      alltoallv(c.ctx, in, sent, rows, received, DType::kUInt8, c.helper);
    }
    reduceRowsExact(f, rows, n, mine, c.divisor, s, out);
    return;
  }
  // Even blocks, so that the even all-to-all and all-gather run (the shared-memory arena's own):
  // a chunk that does not split evenly (the last, or the only one) is padded with zeros into
  // scratch, and its result comes back through scratch.
  const size_t most =
      std::clamp<size_t>(kExchangeRowsBytes / (n * width), 1024, kExchangeBlockElements);
  const bool wanted = c.kind == Kind::kAllreduce || rank == c.root;
  for (size_t begin = 0; begin < c.total; begin += most * n) {
    const size_t m = std::min(most * n, c.total - begin);
    const size_t block = (m + n - 1) / n, bytes = block * width;
    const bool padded = block * n != m;
    const unsigned char* source = in + begin * width;
    unsigned char* target = out == nullptr ? nullptr : out + begin * width;
    if (padded) {
      unsigned char* pad = scratch(s.padded, 2 * n * bytes);
      std::memcpy(pad, source, m * width);
      std::memset(pad + m * width, 0, n * bytes - m * width);
      source = pad;
      target = pad + n * bytes;
    }
    unsigned char* rows = scratch(s.gathered, n * bytes);
    unsigned char* result = scratch(s.gatheredSums, bytes);
    alltoall(c.ctx, source, rows, bytes, DType::kUInt8, c.helper);
    reduceRowsExact(f, rows, n, block, c.divisor, s, result);
    if (c.kind == Kind::kAllreduce) {
      allgather(c.ctx, result, target, bytes, DType::kUInt8, c.helper);
    } else {
      gather(c.ctx, result, wanted ? target : nullptr, bytes, DType::kUInt8, c.root, c.helper);
    }
    if (padded && wanted) std::memcpy(out + begin * width, target, m * width);
  }
}

// The one-pass path: every element's full accumulator, added with int64 SUM through the
// collective of the call's kind, decoded where it is wanted (`blocks`: reduce-scatter's).
void runOnePass(const Call& c) {
  const Format& f = c.f;
  const int words = f.fullWords();
  const ScratchLease lease;
  int64_t* acc = scratch((*lease).full, std::max<size_t>(c.total, 1) * words);
  for (size_t k = 0; k < c.total; ++k) {
    repro::encodeFull(f, repro::loadBits(f, c.in, k), &acc[k * words]);
  }
  const size_t mine = c.ownCount();
  int64_t* sums =
      scratch((*lease).fullSums,
              std::max<size_t>(c.kind == Kind::kReduceScatter ? mine : c.total, 1) * words);
  c.addIntegers(acc, sums, c.total, c.counts, words);
  for (size_t k = 0; k < mine; ++k) {
    const uint64_t bits = repro::decodeFull(f, &sums[k * words], c.ctx.size(), c.divisor);
    repro::storeBits(f, c.out, k, bits);
  }
}

void runReproducible(Context& ctx, Kind kind, const void* in, void* out, size_t total,
                     std::span<const size_t> counts, DType dtype, ReduceOp op, int root,
                     const CollectiveOptions& opts) {
  LOOM_CHECK(reproducibleApplies(op, dtype), "rank ", ctx.rank(), ": reproducible ", kindName(kind),
             ": ", reduceOpName(op), " over ", dtypeName(dtype),
             " is not a reproducible reduction (sum or avg over float, double, half, bfloat16)");
  LOOM_CHECK(ctx.size() <= kReproducibleMaxWorldSize, "rank ", ctx.rank(), ": reproducible ",
             kindName(kind), ": world size ", ctx.size(), " exceeds the maximum ",
             kReproducibleMaxWorldSize);
  CollectiveOptions inner = opts;
  inner.reproducible = false;
  CollectiveOptions helper = inner;
  helper.algorithm = Algorithm::kAuto;
  const Call c{ctx,   kind,
               in,    out,
               total, counts,
               dtype, repro::formatOf(dtype),
               root,  op == ReduceOp::kAvg ? ctx.size() : 1,
               inner, helper};
  if (ctx.size() == 2) {
    if (ordinaryAddsPairs(c)) {
      runOrdinaryPair(c);
    } else {
      runPair(c);
    }
  } else if (runArenaExact(c)) {
    return;
  } else if (gathers(c)) {
    runGathered(c);
  } else if (onePass(c.f, total)) {
    runOnePass(c);
  } else {
    runExchange(c);
  }
}

}  // namespace

bool reproducibleApplies(ReduceOp op, DType dtype) {
  return (op == ReduceOp::kSum || op == ReduceOp::kAvg) && isFloatingPoint(dtype);
}

void checkReproducible(ReduceOp op, DType dtype) {
  LOOM_CHECK(!(op == ReduceOp::kProd && isFloatingPoint(dtype)),
             "reproducible mode: ", reduceOpName(op), " over ", dtypeName(dtype),
             " cannot be made reproducible (the mode covers sum and avg over floating dtypes; "
             "min, max and every integer op are exact already); turn the mode off for this call");
}

void reproducibleAllreduce(Context& ctx, const void* in, void* out, size_t count, DType dtype,
                           ReduceOp op, const CollectiveOptions& opts) {
  runReproducible(ctx, Kind::kAllreduce, in, out, count, {}, dtype, op, 0, opts);
}

void reproducibleReduce(Context& ctx, const void* in, void* out, size_t count, DType dtype,
                        ReduceOp op, int root, const CollectiveOptions& opts) {
  runReproducible(ctx, Kind::kReduce, in, out, count, {}, dtype, op, root, opts);
}

void reproducibleReduceScatterv(Context& ctx, const void* in, void* out,
                                std::span<const size_t> counts, DType dtype, ReduceOp op,
                                const CollectiveOptions& opts) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  runReproducible(ctx, Kind::kReduceScatter, in, out, total, counts, dtype, op, 0, opts);
}

void reproducibleReduceLocal(std::span<const void* const> inputs, void* out, size_t count,
                             DType dtype, ReduceOp op, ReproduciblePath path, size_t* refined) {
  LOOM_CHECK(reproducibleApplies(op, dtype), "reproducibleReduceLocal: ", reduceOpName(op),
             " over ", dtypeName(dtype), " is not a reproducible reduction");
  const int ranks = static_cast<int>(inputs.size());
  LOOM_CHECK(ranks >= 1 && ranks <= kReproducibleMaxWorldSize, "reproducibleReduceLocal: ", ranks,
             " inputs; expected 1 to ", kReproducibleMaxWorldSize);
  const Format& f = repro::formatOf(dtype);
  const int divisor = op == ReduceOp::kAvg ? ranks : 1;
  if (refined != nullptr) *refined = 0;
  LOOM_CHECK(path != ReproduciblePath::kPair || ranks == 2,
             "reproducibleReduceLocal: the pair path adds two inputs, got ", ranks);
  if (path == ReproduciblePath::kPair || (path == ReproduciblePath::kAuto && ranks == 2)) {
    repro::addPairs(f, inputs[0], inputs[1], count, divisor == 2, out);
    return;
  }
  std::vector<int64_t> one(f.fullWords()), sum(f.fullWords());
  const auto full = [&](size_t i) {
    reduceElementFull(f, inputs, i, divisor, one.data(), sum.data(), out, i);
  };
  const bool single =
      path == ReproduciblePath::kOnePass || (path == ReproduciblePath::kAuto && onePass(f, count));
  if (single) {
    for (size_t i = 0; i < count; ++i) full(i);
    return;
  }
  // The windowed path with the same bulk loops as the collectives, the ranks' reductions done
  // here (max of the bytes, sum of the digits).
  const ScratchLease lease;
  if (path == ReproduciblePath::kAuto) {  // as the collectives: the double sums first (float32)
    reduceRowsExact(f, inputs, count, divisor, *lease, out);
    return;
  }
  std::vector<size_t> undecided;
  reduceRowsWindowed(f, inputs, count, divisor, *lease, out, undecided);
  if (refined != nullptr) *refined = undecided.size();
  for (size_t i : undecided) full(i);
}

}  // namespace loom::comm
