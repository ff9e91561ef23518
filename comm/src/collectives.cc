// The public collectives: one path for all of them. A call is validated once (before the first
// message, so an InvalidArgumentError leaves the Context usable; any later error has aborted
// the transport, see algorithms/op.h), world size 1 is answered here, and the rest goes to the
// engine the Context chose at creation (engine/engine.h). Count 0 goes there too: it moves
// nothing, but its signature must meet the other ranks', or a rank that passed count 0 would
// return while one that passed N waits out its deadline.
#include "loom/comm/collectives.h"

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "algorithms/op.h"
#include "algorithms/select.h"
#include "engine/engine.h"
#include "engine/engines.h"
#include "loom/comm/context.h"
#include "loom/comm/reproducible.h"
#include "loom/comm/transport.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "ordinary_reductions.h"
#include "signature.h"
#include "tag.h"

namespace loom::comm {

namespace {

// Which buffers an operation reads and writes, and on which ranks they must be non-null.
enum class Needs : uint8_t { kNone, kAll, kRoot };

struct Shape {
  bool reduces;  // takes a ReduceOp
  bool rooted;   // takes a root
  Needs in;
  Needs out;
  const char* inName;
  const char* outName;
};

constexpr Shape shapeOf(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kReduceScatter:
      return {true, false, Needs::kAll, Needs::kAll, "input", "output"};
    case OpType::kReduce:
      return {true, true, Needs::kAll, Needs::kRoot, "input", "output on the root"};
    case OpType::kBroadcast:
      return {false, true, Needs::kNone, Needs::kAll, "", "buffer"};
    case OpType::kAllgather:
    case OpType::kAlltoall:
    case OpType::kAlltoallv:
    case OpType::kAllgatherv:
      return {false, false, Needs::kAll, Needs::kAll, "input", "output"};
    case OpType::kReduceScatterv:
      return {true, false, Needs::kAll, Needs::kAll, "input", "output"};
    case OpType::kGather:
    case OpType::kGatherv:
      return {false, true, Needs::kAll, Needs::kRoot, "input", "output on the root"};
    case OpType::kScatter:
      return {false, true, Needs::kRoot, Needs::kAll, "input on the root", "output"};
    default:  // barrier
      return {false, false, Needs::kNone, Needs::kNone, "", ""};
  }
}

void checkBuffer(const void* p, size_t count, const char* what, const char* name) {
  LOOM_CHECK(p != nullptr || count == 0, what, ": ", name, " is null but count is ", count);
}

// As above, naming the operation only when the check fails (the collectives' hot path).
void checkBuffer(const void* p, size_t count, OpType type, const char* name) {
  if (p == nullptr && count != 0) [[unlikely]]
    checkBuffer(p, count, opTypeName(type), name);
}

// Overlapping buffers must be the collective's in-place form (NCCL's and c10d's rule): one
// buffer (all-reduce, reduce, all-to-all), or this rank's block of the larger buffer (all-gather
// and gather: in == out + `blockBytes`; reduce-scatter and scatter: out == in + `blockBytes`).
// Anything else has a rank overwrite what it or a peer still reads (window peers read in place,
// staged steps read later blocks), so it is refused before the first message. `in`/`out` of
// `inBytes`/`outBytes` (0: not used on this rank).
void checkAliasing(OpType type, int rank, const void* in, size_t inBytes, const void* out,
                   size_t outBytes, size_t blockBytes, const Shape& shape) {
  if (in == nullptr || out == nullptr || inBytes == 0 || outBytes == 0) return;
  const auto* i = static_cast<const uint8_t*>(in);
  const auto* o = static_cast<const uint8_t*>(out);
  if (!(i < o + outBytes && o < i + inBytes)) return;
  const char* form = "";
  switch (type) {
    case OpType::kAllgather:
    case OpType::kAllgatherv:
    case OpType::kGather:
    case OpType::kGatherv:
      if (i == o + blockBytes) return;
      form = "in place, the input is this rank's block of the output (in == out + ";
      break;
    case OpType::kReduceScatter:
    case OpType::kReduceScatterv:
    case OpType::kScatter:
      if (o == i + blockBytes) return;
      form = "in place, the output is this rank's block of the input (out == in + ";
      break;
    default:
      if (i == o) return;
      form = "in place, input and output are one buffer (out == in, an offset of ";
      blockBytes = 0;
      break;
  }
  LOOM_THROW(InvalidArgumentError, "rank ", rank, ": ", opTypeName(type), ": the ", shape.outName,
             " [", out, ", +", outBytes, " bytes) overlaps the ", shape.inName, " [", in, ", +",
             inBytes, " bytes) without being its in-place form: ", form, blockBytes,
             " bytes); partly overlapping buffers would be overwritten while they are read (pass "
             "separate buffers, or the in-place form)");
}

thread_local bool tOrdinaryReductions = false;

bool reproducibleMode(const CollectiveCall& c) {
  return (c.opts.reproducible || c.ctx.reproducible()) && !tOrdinaryReductions;
}

// Reproducible mode (loom/comm/reproducible.h) takes SUM and AVG over floating dtypes: it
// reduces integers through these same collectives, then rounds once.
bool runReproducible(const CollectiveCall& c) {
  if (!reproducibleMode(c) || !reproducibleApplies(c.op, c.dtype)) return false;
  switch (c.type) {
    case OpType::kAllreduce:
      reproducibleAllreduce(c.ctx, c.in, c.out, c.count, c.dtype, c.op, c.opts);
      return true;
    case OpType::kReduce:
      reproducibleReduce(c.ctx, c.in, c.out, c.count, c.dtype, c.op, c.root, c.opts);
      return true;
    case OpType::kReduceScatter: {
      const std::vector<size_t> counts(c.ctx.size(), c.count);
      reproducibleReduceScatterv(c.ctx, c.in, c.out, counts, c.dtype, c.op, c.opts);
      return true;
    }
    case OpType::kReduceScatterv:
      reproducibleReduceScatterv(c.ctx, c.in, c.out, c.counts, c.dtype, c.op, c.opts);
      return true;
    default:
      return false;
  }
}

void validate(const CollectiveCall& c, const Shape& shape) {
  const Context& ctx = c.ctx;
  (void)dtypeSize(c.dtype);  // throws on an unknown dtype
  if (shape.reduces) checkReduceOp(c.op, c.dtype);
  if (shape.rooted) {
    LOOM_CHECK(c.root >= 0 && c.root < ctx.size(), opTypeName(c.type), ": root ", c.root,
               " is out of range for world size ", ctx.size());
  }
  const bool isRoot = shape.rooted && ctx.rank() == c.root;
  if (shape.in == Needs::kAll || (shape.in == Needs::kRoot && isRoot)) {
    checkBuffer(c.in, c.count, c.type, shape.inName);
  }
  const bool usesOut = shape.out == Needs::kAll || (shape.out == Needs::kRoot && isRoot);
  if (usesOut) checkBuffer(c.out, c.count, c.type, shape.outName);
  if (usesOut && (shape.in == Needs::kAll || (shape.in == Needs::kRoot && isRoot))) {
    // Bytes of each buffer on this rank, and of one rank's block.
    const size_t block = c.count * dtypeSize(c.dtype);
    const size_t all = block * static_cast<size_t>(ctx.size());
    size_t inBytes = block, outBytes = block;
    switch (c.type) {
      case OpType::kAllgather:
      case OpType::kGather:
        outBytes = all;
        break;
      case OpType::kReduceScatter:
      case OpType::kScatter:
        inBytes = all;
        break;
      case OpType::kAlltoall:
        inBytes = outBytes = all;
        break;
      default:
        break;
    }
    checkAliasing(c.type, ctx.rank(), c.in, inBytes, c.out, outBytes,
                  block * static_cast<size_t>(ctx.rank()), shape);
  }
  checkAlgorithm(c.type, c.opts.algorithm);
  if (shape.reduces && reproducibleMode(c)) checkReproducible(c.op, c.dtype);
}

// The engines of a Context implemented outside comm (Context::engines() is null).
EngineSet& defaultEngines() {
  static EngineSet engines(makeGenericEngine({}), nullptr, Algorithm::kAuto);
  return engines;
}

// The caller's options with the deadline resolved: zero takes the Context's timeout.
CollectiveOptions resolved(const Context& ctx, const CollectiveOptions& opts) {
  LOOM_CHECK(opts.timeout.count() >= 0, "rank ", ctx.rank(), ": CollectiveOptions::timeout is ",
             opts.timeout.count(), " ms; expected a positive deadline, or 0 for the Context's (",
             ctx.timeout().count(), " ms)");
  CollectiveOptions o = opts;
  if (o.timeout.count() == 0) o.timeout = ctx.timeout();
  return o;
}

// float16 and bfloat16 AVG: every rank divides its input by the world size before the sum,
// as NCCL's ncclAvg does for floating types. Summing first rounds to the 16-bit type at every
// step, and the sum overflows where the average does not (float16, 2 ranks of 40000: inf
// instead of 40000). `inCount` elements of c.in are read; an all-reduce in place scales its
// buffer (which it overwrites anyway), everything else a copy in `scaled`. Returns the call to
// run: the SUM of the scaled inputs, or `c` itself for any other call.
CollectiveCall prescaleHalfAvg(const CollectiveCall& c, size_t inCount,
                               std::vector<uint16_t>& scaled) {
  if (c.op != ReduceOp::kAvg || (c.dtype != DType::kFloat16 && c.dtype != DType::kBFloat16)) {
    return c;
  }
  void* in = c.out;
  if (c.type != OpType::kAllreduce || c.in != c.out) {
    scaled.resize(inCount);
    if (inCount > 0) std::memcpy(scaled.data(), c.in, inCount * sizeof(uint16_t));
    in = scaled.data();
  }
  if (inCount > 0) divideBy(in, inCount, c.dtype, c.ctx.size());
  CollectiveCall sum = c;
  sum.in = in;
  sum.op = ReduceOp::kSum;
  return sum;
}

// A validated even collective on the Context's engine. Every message of the collective carries
// its signature (signature.h).
void runOnEngine(const CollectiveCall& c, const Shape& shape) {
  // The signature keeps the caller's op: a rank that calls SUM where the others call AVG is a
  // mismatch, whatever prescaleHalfAvg runs.
  const SignatureScope signature(
      packSignature(c.type, c.dtype, c.count, shape.reduces, c.op, shape.rooted, c.root));
  std::vector<uint16_t> scaled;
  const size_t inCount =
      c.type == OpType::kReduceScatter ? c.count * static_cast<size_t>(c.ctx.size()) : c.count;
  const CollectiveCall call = shape.reduces ? prescaleHalfAvg(c, inCount, scaled) : c;
  EngineSet* engines = c.ctx.engines();
  (engines != nullptr ? *engines : defaultEngines()).engineFor(call).run(call);
}

void run(const CollectiveCall& c) {
  const Shape shape = shapeOf(c.type);
  validate(c, shape);
  if (c.ctx.size() == 1) {
    // Every output is this rank's own input (avg over one rank is the value itself).
    if (shape.in != Needs::kNone && c.out != c.in && c.count > 0) {
      std::memmove(c.out, c.in, c.count * dtypeSize(c.dtype));
    }
    return;
  }
  if (runReproducible(c)) return;
  runOnEngine(c, shape);
}

// The uneven collectives: counts checked against the world size (and, for alltoallv in place,
// the totals against each other), buffers against the totals this rank reads and writes.
// World size 1 is answered here; everything else goes to the generic engine (no other engine
// implements them), with no count-0 shortcut: every pair of ranks exchanges a message, empty
// or not, that carries the signature.
void runUneven(const CollectiveCall& c) {
  const Context& ctx = c.ctx;
  const char* what = opTypeName(c.type);
  const size_t esize = dtypeSize(c.dtype);
  const Shape shape = shapeOf(c.type);
  if (shape.reduces) checkReduceOp(c.op, c.dtype);
  if (shape.reduces && reproducibleMode(c)) checkReproducible(c.op, c.dtype);
  if (shape.rooted) {
    LOOM_CHECK(c.root >= 0 && c.root < ctx.size(), "rank ", ctx.rank(), ": ", what, ": root ",
               c.root, " is out of range for world size ", ctx.size());
  }
  const auto checkCounts = [&](std::span<const size_t> counts, const char* name) {
    LOOM_CHECK(counts.size() == static_cast<size_t>(ctx.size()), "rank ", ctx.rank(), ": ", what,
               ": ", name, " has ", counts.size(), " entries; expected one per rank (", ctx.size(),
               ")");
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  };
  const size_t total = checkCounts(c.counts, c.type == OpType::kAlltoallv ? "inCounts" : "counts");
  size_t inCount = total, outCount = total;
  switch (c.type) {
    case OpType::kAlltoallv:
      outCount = checkCounts(c.outCounts, "outCounts");
      LOOM_CHECK(c.in != c.out || inCount == outCount, "rank ", ctx.rank(), ": ", what,
                 ": in place needs as many elements in as out, got inCounts summing to ", inCount,
                 " and outCounts summing to ", outCount);
      break;
    case OpType::kAllgatherv:
      inCount = c.counts[ctx.rank()];
      break;
    case OpType::kGatherv:
      inCount = c.counts[ctx.rank()];
      if (ctx.rank() != c.root) outCount = 0;
      break;
    case OpType::kReduceScatterv:
      outCount = c.counts[ctx.rank()];
      break;
    default:
      break;
  }
  checkBuffer(c.in, inCount, what, shape.inName);
  checkBuffer(c.out, outCount, what, shape.outName);
  const size_t before =
      c.type == OpType::kAlltoallv
          ? 0
          : std::accumulate(c.counts.begin(), c.counts.begin() + ctx.rank(), size_t{0});
  checkAliasing(c.type, ctx.rank(), c.in, inCount * esize, c.out, outCount * esize, before * esize,
                shape);
  checkAlgorithm(c.type, c.opts.algorithm);
  if (ctx.size() == 1) {
    // The one block is this rank's own (avg over one rank is the value itself).
    LOOM_CHECK(inCount == outCount || c.type == OpType::kGatherv, "rank 0: ", what, ": sends ",
               inCount, " elements to itself but receives ", outCount);
    if (inCount > 0 && c.out != c.in) std::memmove(c.out, c.in, inCount * esize);
    return;
  }
  if (runReproducible(c)) return;
  // Message sizes differ by design: the signature holds op, dtype, reduce op, root and a digest
  // of the counts every rank passes alike (alltoallv's differ per rank: none); each message
  // adds its own block's count (algorithms/uneven.cc, signature.h).
  const uint64_t digest = c.type == OpType::kAlltoallv ? 0 : countsDigest(c.counts);
  const SignatureScope signature(
      packUnevenSignature(c.type, c.dtype, shape.reduces, c.op, shape.rooted, c.root, digest));
  std::vector<uint16_t> scaled;  // float16 / bfloat16 AVG (reduceScatterv): see prescaleHalfAvg
  const CollectiveCall call = shape.reduces ? prescaleHalfAvg(c, inCount, scaled) : c;
  EngineSet* engines = c.ctx.engines();
  (engines != nullptr ? *engines : defaultEngines()).generic().run(call);
}

}  // namespace

void alltoallv(Context& ctx, const void* in, std::span<const size_t> inCounts, void* out,
               std::span<const size_t> outCounts, DType dtype, const CollectiveOptions& opts) {
  const size_t total = std::accumulate(inCounts.begin(), inCounts.end(), size_t{0}) +
                       std::accumulate(outCounts.begin(), outCounts.end(), size_t{0});
  runUneven({ctx, resolved(ctx, opts), OpType::kAlltoallv, in, out, total, dtype, ReduceOp::kSum, 0,
             inCounts, outCounts});
}

void allgatherv(Context& ctx, const void* in, void* out, std::span<const size_t> counts,
                DType dtype, const CollectiveOptions& opts) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  runUneven({ctx, resolved(ctx, opts), OpType::kAllgatherv, in, out, total, dtype, ReduceOp::kSum,
             0, counts});
}

void gatherv(Context& ctx, const void* in, void* out, std::span<const size_t> counts, DType dtype,
             int root, const CollectiveOptions& opts) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  runUneven({ctx, resolved(ctx, opts), OpType::kGatherv, in, out, total, dtype, ReduceOp::kSum,
             root, counts});
}

void reduceScatterv(Context& ctx, const void* in, void* out, std::span<const size_t> counts,
                    DType dtype, ReduceOp op, const CollectiveOptions& opts) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  runUneven(
      {ctx, resolved(ctx, opts), OpType::kReduceScatterv, in, out, total, dtype, op, 0, counts});
}

void allreduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
               const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kAllreduce, in, out, count, dtype, op});
}

void broadcast(Context& ctx, void* buf, size_t count, DType dtype, int root,
               const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kBroadcast, buf, buf, count, dtype, ReduceOp::kSum, root});
}

void reduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
            int root, const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kReduce, in, out, count, dtype, op, root});
}

void allgather(Context& ctx, const void* in, void* out, size_t count, DType dtype,
               const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kAllgather, in, out, count, dtype});
}

void reduceScatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                   const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kReduceScatter, in, out, count, dtype, op});
}

void gather(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
            const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kGather, in, out, count, dtype, ReduceOp::kSum, root});
}

void scatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
             const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kScatter, in, out, count, dtype, ReduceOp::kSum, root});
}

void alltoall(Context& ctx, const void* in, void* out, size_t count, DType dtype,
              const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kAlltoall, in, out, count, dtype});
}

void barrier(Context& ctx, const CollectiveOptions& opts) {
  run({ctx, resolved(ctx, opts), OpType::kBarrier});
}

uint64_t pointToPointTag(uint64_t tag) {
  static_assert(kMaxPointToPointTag == kMaxP2PTag, "public and wire tag limits agree");
  return makeP2PTag(tag);
}

void send(Context& ctx, const void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts) {
  LOOM_CHECK(peer >= 0 && peer < ctx.size() && peer != ctx.rank(), "send: peer ", peer,
             " must be another rank of this world of size ", ctx.size(), " (this is rank ",
             ctx.rank(), ")");
  LOOM_CHECK(tag <= kMaxP2PTag, "send: tag ", tag, " exceeds the maximum ", kMaxP2PTag);
  checkBuffer(buf, count, "send", "buffer");
  CollectiveOptions o2 = resolved(ctx, opts);
  o2.seq = 0;  // the user's tag, not the sequence number, identifies point-to-point messages
  Op o(ctx, OpType::kSend, o2);
  auto r = o.sendTagged(peer, buf, count * dtypeSize(dtype), makeP2PTag(tag));
  o.wait(r);
}

void recv(Context& ctx, void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts) {
  LOOM_CHECK(peer >= 0 && peer < ctx.size() && peer != ctx.rank(), "recv: peer ", peer,
             " must be another rank of this world of size ", ctx.size(), " (this is rank ",
             ctx.rank(), ")");
  LOOM_CHECK(tag <= kMaxP2PTag, "recv: tag ", tag, " exceeds the maximum ", kMaxP2PTag);
  checkBuffer(buf, count, "recv", "buffer");
  CollectiveOptions o2 = resolved(ctx, opts);
  o2.seq = 0;
  Op o(ctx, OpType::kRecv, o2);
  auto r = o.recvTagged(peer, buf, count * dtypeSize(dtype), makeP2PTag(tag));
  o.wait(r);
}

int recvAny(Context& ctx, void* buf, size_t count, DType dtype, uint64_t tag,
            const CollectiveOptions& opts) {
  LOOM_CHECK(ctx.size() > 1, "recv from any source: rank ", ctx.rank(),
             " is alone in its world: no rank can send to it");
  LOOM_CHECK(tag <= kMaxP2PTag, "recv: tag ", tag, " exceeds the maximum ", kMaxP2PTag);
  checkBuffer(buf, count, "recv", "buffer");
  // How it works: look at every other rank's unexpected messages in turn (starting after the
  // last one found, so that no sender starves) until one holds a message with the wire tag,
  // then receive it from that rank like recv(). Between rounds spin briefly, then yield, then
  // nap up to 1 ms: a message that arrives while nobody receives waits in the transport.
  static thread_local int start = 0;
  Transport& transport = ctx.transport();
  const uint64_t wireTag = makeP2PTag(tag);
  const CollectiveOptions o = resolved(ctx, opts);
  const Deadline deadline(o.timeout);
  int source = -1;
  for (int round = 0; source < 0; ++round) {
    for (int i = 1; i < ctx.size() && source < 0; ++i) {
      const int peer = (ctx.rank() + start + i) % ctx.size();
      if (peer != ctx.rank() && transport.probe(peer, wireTag)) source = peer;
    }
    if (source >= 0) break;
    if (transport.failed()) {
      LOOM_THROW(IoError, "rank ", ctx.rank(), ": recv from any source (tag ", tag,
                 ") failed: the transport was aborted");
    }
    if (deadline.expired()) {
      LOOM_THROW(TimeoutError, "rank ", ctx.rank(), ": recv from any source timed out after ",
                 o.timeout.count(), " ms: no rank of ", ctx.size(), " sent tag ", tag, " (",
                 count * dtypeSize(dtype), " bytes)");
    }
    if (round < 64) continue;
    if (round < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::min(std::chrono::microseconds(1000), std::chrono::microseconds(round - 255)));
    }
  }
  start = (source - ctx.rank() + ctx.size()) % ctx.size();
  recv(ctx, buf, count, dtype, source, tag, o);
  return source;
}

void runValidatedOrdinary(Context& ctx, OpType type, const void* in, void* out, size_t count,
                          DType dtype, ReduceOp op, int root, const CollectiveOptions& opts) {
  runOnEngine({ctx, opts, type, in, out, count, dtype, op, root}, shapeOf(type));
}

OrdinaryReductions::OrdinaryReductions() : previous_(tOrdinaryReductions) {
  tOrdinaryReductions = true;
}

OrdinaryReductions::~OrdinaryReductions() {
  tOrdinaryReductions = previous_;
}

bool OrdinaryReductions::active() {
  return tOrdinaryReductions;
}

}  // namespace loom::comm
