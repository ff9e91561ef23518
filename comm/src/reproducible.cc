// The reproducible collectives (loom/comm/reproducible.h): the data movement around the integer
// formats of reproducible_accumulator.h.
//
// How it works, for one call over `total` input elements of which this rank writes `own`
// (all of them for all-reduce, all on the root for reduce, block rank for reduce-scatter):
// - one pass, small buffers: every value becomes a full accumulator (`words` int64 per
//   element), the ranks add them with int64 SUM through the ordinary collective of the same
//   kind, and each rank decodes its own elements;
// - windowed: `bytes` (one exponent byte per element) is all-reduced with uint8 MAX; every rank
//   truncates its values into `digits` windows anchored there; the ordinary collective adds the
//   digits; each rank decodes its own elements and lists the ones the window cannot decide
//   (`undecided`, global indices, in order). The lists are made known to every rank (all-reduce:
//   every rank computed the same list; reduce: the root broadcasts it; reduce-scatter: an
//   all-gather), then those elements alone go through the one-pass path.
// All-reduce and reduce run the windowed passes chunk by chunk (kWindowChunkBytes of digits), so
// that their scratch stays in cache; reduce-scatter's blocks cover the whole input, it runs them
// once. Nothing is written to `out` for an undecided element before its refinement, so that
// in-place calls still read the original input there.
#include "loom/comm/reproducible.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "reproducible_accumulator.h"

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
  const Format& f;
  int root;
  int divisor;
  CollectiveOptions inner;   // the caller's options, mode off
  CollectiveOptions helper;  // the same with the automatic algorithm (exchanges of lists)

  size_t ownBegin() const {
    if (kind != Kind::kReduceScatter) return 0;
    return std::accumulate(counts.begin(), counts.begin() + ctx.rank(), size_t{0});
  }
  size_t ownCount() const {
    if (kind == Kind::kReduceScatter) return counts[ctx.rank()];
    if (kind == Kind::kReduce && ctx.rank() != root) return 0;
    return total;
  }

  // Adds every rank's `words`-word integers (int64, or int32 for the narrow window): in holds
  // them for `elements` elements (blocks in rank order, `blocks[j]` elements each for
  // reduce-scatter), result receives this rank's own block (all of them for all-reduce, the
  // root's for reduce).
  void addIntegers(const void* in, void* result, size_t elements, std::span<const size_t> blocks,
                   int words, DType type = DType::kInt64) const {
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
// All-reduce and reduce run the windowed path in chunks of this many bytes of wide window digits
// (65,536 float32 elements; the narrow window's digits of a chunk take half).
constexpr size_t kWindowChunkBytes = size_t{512} << 10;

template <typename T>
T* scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

struct Scratch {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> digits, sums;
  std::vector<int32_t> narrowDigits, narrowSums;      // the narrow window's
  std::vector<unsigned char> gathered, gatheredSums;  // runGathered's slots
  std::vector<uint8_t> rankBytes;
  std::vector<int64_t> full, fullSums;  // reduceFull's accumulators
};

class ScratchLease {
 public:
  ScratchLease() {
    thread_local Scratch kept;
    s_ = &kept;
  }
  ~ScratchLease() {
    release(s_->bytes);
    release(s_->digits);
    release(s_->sums);
    release(s_->narrowDigits);
    release(s_->narrowSums);
    release(s_->gathered);
    release(s_->gatheredSums);
    release(s_->rankBytes);
    release(s_->full);
    release(s_->fullSums);
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
// the windows (the narrow window where `narrow` is usable), the decode into out; undecided
// elements are appended to `undecided` (out left alone there).
void reduceRowsWindowed(const Format& f, std::span<const void* const> inputs, size_t count,
                        int divisor, const repro::NarrowWindow& narrow, Scratch& s, void* out,
                        std::vector<size_t>& undecided) {
  const int ranks = static_cast<int>(inputs.size());
  uint8_t* bytes = scratch(s.bytes, count);
  uint8_t* rankBytes = scratch(s.rankBytes, count);
  std::fill(bytes, bytes + count, 0);
  for (const void* in : inputs) {
    repro::exponentBytes(f, in, count, rankBytes);
    repro::maxBytes(bytes, rankBytes, count);
  }
  if (narrow.usable()) {
    int32_t* sums = scratch(s.narrowSums, count);
    int32_t* digits = scratch(s.narrowDigits, count);
    std::fill(sums, sums + count, 0);
    for (const void* in : inputs) {
      repro::encodeNarrow(f, narrow, in, count, bytes, digits);
      repro::addInts(sums, digits, count);
    }
    repro::decodeNarrow(f, narrow, sums, bytes, count, divisor, out, 0, undecided);
    return;
  }
  const size_t words = count * f.windowDigits;
  int64_t* sums = scratch(s.sums, words);
  int64_t* digits = scratch(s.digits, words);
  std::fill(sums, sums + words, 0);
  for (const void* in : inputs) {
    repro::encodeWindows(f, in, count, bytes, digits);
    repro::addInts(sums, digits, words);
  }
  repro::decodeWindows(f, sums, bytes, count, ranks, divisor, out, 0, undecided);
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
  std::array<const void*, kMaxGatherRanks> rowPointers;
  for (int r = 0; r < n; ++r) rowPointers[r] = rows + r * row;
  const std::span<const void* const> inputs(rowPointers.data(), n);
  std::vector<size_t> undecided;
  reduceRowsWindowed(f, inputs, c.total, c.divisor, repro::narrowWindow(f, n), s, c.out, undecided);
  if (undecided.empty()) return;
  int64_t* acc = scratch(s.full, 2 * f.fullWords());
  for (size_t i : undecided) {
    reduceElementFull(f, inputs, i, c.divisor, acc, acc + f.fullWords(), c.out, i);
  }
}

// Refines (or, for the one-pass path, computes) the elements `indices` (global, ascending, every
// rank's own ones in rank order; `blocks[j]` of them belong to rank j; empty: every element,
// 0..total-1) with full accumulators.
void reduceFull(const Call& c, std::span<const size_t> indices, std::span<const size_t> blocks) {
  const Format& f = c.f;
  const int words = f.fullWords();
  const bool every = indices.empty();
  const size_t count = every ? c.total : indices.size();
  const auto index = [&](size_t k) { return every ? k : indices[k]; };
  const ScratchLease lease;
  int64_t* acc = scratch((*lease).full, count * words);
  for (size_t k = 0; k < count; ++k) {
    repro::encodeFull(f, repro::loadBits(f, c.in, index(k)), &acc[k * words]);
  }
  size_t first = 0, mine = count;
  if (c.kind == Kind::kReduceScatter) {
    first = std::accumulate(blocks.begin(), blocks.begin() + c.ctx.rank(), size_t{0});
    mine = blocks[c.ctx.rank()];
  } else if (c.kind == Kind::kReduce && c.ctx.rank() != c.root) {
    mine = 0;
  }
  int64_t* sums =
      scratch((*lease).fullSums,
              std::max<size_t>(c.kind == Kind::kReduceScatter ? mine : count, 1) * words);
  c.addIntegers(acc, sums, count, blocks, words);
  const size_t base = c.ownBegin();
  for (size_t k = 0; k < mine; ++k) {
    const size_t at = c.kind == Kind::kReduceScatter ? k : first + k;
    const uint64_t bits = repro::decodeFull(f, &sums[at * words], c.ctx.size(), c.divisor);
    repro::storeBits(f, c.out, index(first + k) - base, bits);
  }
}

void runOnePass(const Call& c) {
  reduceFull(c, {}, c.counts);
}

void runWindowed(const Call& c) {
  const Format& f = c.f;
  const ScratchLease lease;
  Scratch& scratchBuffers = *lease;
  // The window pass: float32 over two ranks takes the narrow window (one int32 per element),
  // everything else the wide one (f.windowDigits int64 per element).
  const repro::NarrowWindow narrow = repro::narrowWindow(f, c.ctx.size());
  const int words = narrow.usable() ? 1 : f.windowDigits;
  void* digits = nullptr;
  void* sums = nullptr;
  const auto reserve = [&](size_t elements, size_t sumElements) {
    if (narrow.usable()) {
      digits = scratch(scratchBuffers.narrowDigits, elements);
      sums = scratch(scratchBuffers.narrowSums, std::max<size_t>(sumElements, 1));
    } else {
      digits = scratch(scratchBuffers.digits, elements * words);
      sums = scratch(scratchBuffers.sums, std::max<size_t>(sumElements, 1) * words);
    }
  };
  const auto encode = [&](const void* in, size_t n, const uint8_t* bytes) {
    if (narrow.usable()) {
      repro::encodeNarrow(f, narrow, in, n, bytes, static_cast<int32_t*>(digits));
    } else {
      repro::encodeWindows(f, in, n, bytes, static_cast<int64_t*>(digits));
    }
  };
  const auto add = [&](size_t n) {
    c.addIntegers(digits, sums, n, c.counts, words,
                  narrow.usable() ? DType::kInt32 : DType::kInt64);
  };
  std::vector<size_t> undecided;
  const auto decode = [&](const uint8_t* bytes, size_t n, void* out, size_t base) {
    if (narrow.usable()) {
      repro::decodeNarrow(f, narrow, static_cast<const int32_t*>(sums), bytes, n, c.divisor, out,
                          base, undecided);
    } else {
      repro::decodeWindows(f, static_cast<const int64_t*>(sums), bytes, n, c.ctx.size(), c.divisor,
                           out, base, undecided);
    }
  };
  if (c.kind == Kind::kReduceScatter) {
    uint8_t* bytes = scratch(scratchBuffers.bytes, c.total);
    repro::exponentBytes(f, c.in, c.total, bytes);
    allreduce(c.ctx, bytes, bytes, c.total, DType::kUInt8, ReduceOp::kMax, c.helper);
    const size_t base = c.ownBegin(), own = c.ownCount();
    reserve(c.total, own);
    encode(c.in, c.total, bytes);
    add(c.total);
    decode(bytes + base, own, c.out, base);
  } else {
    // All-reduce and reduce cover the same elements on every rank: chunk by chunk, so that the
    // scratch (a chunk's bytes, digits and sums) stays in cache and is never larger than a
    // chunk. Every element's integers are the same whatever the chunking.
    const size_t chunk = kWindowChunkBytes / (sizeof(int64_t) * f.windowDigits);
    const bool decodes = c.ownCount() != 0;
    uint8_t* bytes = scratch(scratchBuffers.bytes, std::min(c.total, chunk));
    reserve(std::min(c.total, chunk), std::min(c.total, chunk));
    for (size_t begin = 0; begin < c.total; begin += chunk) {
      const size_t n = std::min(chunk, c.total - begin);
      const void* in = static_cast<const unsigned char*>(c.in) + begin * f.bytes;
      repro::exponentBytes(f, in, n, bytes);
      allreduce(c.ctx, bytes, bytes, n, DType::kUInt8, ReduceOp::kMax,
                c.kind == Kind::kAllreduce ? c.inner : c.helper);
      encode(in, n, bytes);
      add(n);
      if (decodes) decode(bytes, n, static_cast<unsigned char*>(c.out) + begin * f.bytes, begin);
    }
  }
  // Make the undecided elements known to every rank.
  std::vector<size_t> blocks;
  switch (c.kind) {
    case Kind::kAllreduce:  // every rank decoded the same sums
      blocks = {undecided.size()};
      break;
    case Kind::kReduce: {
      int64_t m = static_cast<int64_t>(undecided.size());
      broadcast(c.ctx, &m, 1, DType::kInt64, c.root, c.helper);
      undecided.resize(static_cast<size_t>(m));
      if (m > 0)
        broadcast(c.ctx, undecided.data(), undecided.size(), DType::kInt64, c.root, c.helper);
      blocks = {undecided.size()};
      break;
    }
    case Kind::kReduceScatter: {
      static_assert(sizeof(size_t) == sizeof(int64_t));
      std::vector<int64_t> all(c.ctx.size());
      int64_t m = static_cast<int64_t>(undecided.size());
      allgather(c.ctx, &m, all.data(), 1, DType::kInt64, c.helper);
      blocks.assign(all.begin(), all.end());
      const size_t sum = std::accumulate(blocks.begin(), blocks.end(), size_t{0});
      if (sum == 0) return;
      std::vector<size_t> list(sum);
      allgatherv(c.ctx, undecided.data(), list.data(), blocks, DType::kInt64, c.helper);
      undecided = std::move(list);
      break;
    }
  }
  if (undecided.empty()) return;
  reduceFull(c, undecided, blocks);
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
  const Call c{ctx,
               kind,
               in,
               out,
               total,
               counts,
               repro::formatOf(dtype),
               root,
               op == ReduceOp::kAvg ? ctx.size() : 1,
               inner,
               helper};
  if (gathers(c)) {
    runGathered(c);
  } else if (onePass(c.f, total)) {
    runOnePass(c);
  } else {
    runWindowed(c);
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
  const repro::NarrowWindow narrow =
      path == ReproduciblePath::kWindowed ? repro::NarrowWindow{} : repro::narrowWindow(f, ranks);
  const ScratchLease lease;
  std::vector<size_t> undecided;
  reduceRowsWindowed(f, inputs, count, divisor, narrow, *lease, out, undecided);
  if (refined != nullptr) *refined = undecided.size();
  for (size_t i : undecided) full(i);
}

}  // namespace loom::comm
