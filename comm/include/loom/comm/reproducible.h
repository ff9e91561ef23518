// Reproducible reductions: SUM and AVG over float32, float64, float16 and bfloat16 whose result
// is the correctly rounded exact sum (or exact sum / world size) of every rank's inputs,
// element by element, and therefore bitwise the same whatever the algorithm, transport,
// hierarchy, chunk size, tuning, arrival order or assignment of the inputs to ranks
// (docs/reproducible.md).
//
// How it works (docs/reproducible.md):
// - Two ranks (pair): for two values, one IEEE addition in round-to-nearest is the correctly
//   rounded sum, and it commutes. SUM (every form) and AVG (all-reduce; not float16) run the
//   ordinary collective's SUM in the default floating-point environment, then make NaNs
//   canonical (AVG: halve the sums, exact or one rounding of an exact sum, and redo the
//   elements whose sum overflowed from both ranks' inputs: a second round only when a sum is
//   infinite). The other forms exchange the raw values (gather, all-to-all) and each rank adds
//   the pairs itself (comm/src/reproducible_pair.cc says why each dtype's arithmetic is exact).
// From three ranks on, the floats are never added: every element is reduced exactly in integers
// and rounded once.
// - Small buffers (one-pass, at most kReproducibleOnePassBytes of accumulators): every value
//   becomes a full exact accumulator: signed 52-bit digits in int64 words covering the
//   format's whole range (float32 and bfloat16: 6 digits, float16: 1, float64: 41) plus one
//   word counting NaN, +inf, -inf and -0 inputs, added with int64 SUM by the ordinary
//   collective (integer addition is exact and associative). One collective.
// - All-reduce and reduce at the one-pass sizes, over few ranks (gathered: a raw value takes
//   fewer bytes than a full accumulator, n * dtype size < 8 * words): each rank writes its
//   input into its own slot of an otherwise zero buffer of n slots, the ranks all-reduce
//   (reduce) the bytes with uint8 MAX, a gather through the small-message path, and each rank
//   reduces the n rows itself, as the exchange below does. One collective.
// - Larger buffers (exchange): each rank gets every rank's raw values of its block and
//   reduces those n rows alone, and the results come back (over shared memory one staged
//   collective; otherwise an all-to-all, then an all-gather, or a gather for reduce).
//   float32, float16, bfloat16 (SUM and AVG): where an element's values span at most
//   53 - p - ceil(log2 n) binades (p significant bits), their double sum is exact, and it (or
//   its double quotient by n) is rounded once; float64 likewise in pairs of doubles (TwoSum),
//   within 53 - 2 ceil(log2 n) binades, SUM and power-of-two AVG; the rest take the windowed
//   arithmetic. Windowed arithmetic: one byte per element codes
//   the largest exponent of the n values (float64: in groups of 16 exponents); each value is
//   truncated toward zero into a window anchored there (41 value bits in one int64 for float32,
//   bfloat16 and float16, 93 in two for float64); the window's low 11 bits count the rows that
//   dropped nonzero bits below it (c), so the exact sum lies strictly between (T - c) and (T + c)
//   units, and where both ends round to the same value that is the answer. The rest (near a
//   rounding midpoint, heavy cancellation, inf or NaN anywhere) is reduced again from the same
//   rows with full accumulators. No second round on the wire.
//
// Contract
// - Collective and blocking like collectives.h; every rank passes the same arguments.
// - Results: the sum rounded to nearest, ties to even, with IEEE overflow to infinity. AVG is
//   round(exact sum / n), one rounding (not round(round(sum) / n)). Special values: any NaN,
//   or +inf and -inf together, give NaN (the canonical quiet NaN, sign clear, payload 0);
//   otherwise any +inf gives +inf, any -inf gives -inf. An exact zero sum is -0 when every
//   input is -0, else +0 (as IEEE's sum in round-to-nearest).
// - World size at most kReproducibleMaxWorldSize (digits of n ranks add without overflow).
//   World size 1 returns the input unchanged, as every collective does (NaN payloads kept).
// - The caller's floating-point environment is assumed to round to nearest (the default);
//   flush-to-zero and denormals-are-zero modes do not change results (the integer paths leave
//   subnormals to integer code; the pair path runs its loops in the default environment, set
//   for the call and restored after).
// - Collectives per call: two ranks, one (a second only for an AVG whose sum overflowed; the
//   raw exchange: one per 4 MiB); from three ranks, one at the one-pass sizes, else two per
//   chunk of 65,536 elements per rank (fewer from 16 float32 ranks on); each with the caller's
//   timeout and seq.
// - Speed: the float32 passes run in AVX2 where the reduce kernels do (reduceKernelIsa()),
//   with the same bits as the scalar loops (ReduceIsa::kGeneric).
// - Wire cost per element: the dtype's own size, as the ordinary collective (pair, exchange);
//   one pass: full accumulators, 56, 56, 16 and 336 bytes per element (float32, bfloat16,
//   float16, float64); gathered: n times the dtype's size.
// - Errors: InvalidArgumentError (Context still usable) for PROD over a floating dtype (not
//   reproducible, refused rather than silently not), a world above the maximum. Integer
//   dtypes, MIN and MAX are exact already and run unchanged; bitwise ops as usual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"

namespace loom::comm {

class Context;

constexpr int kReproducibleMaxWorldSize = 1024;
constexpr size_t kReproducibleOnePassBytes = size_t{16} << 10;

// Whether the reproducible mode changes how (op, dtype) is reduced: SUM and AVG over the four
// floating dtypes.
bool reproducibleApplies(ReduceOp op, DType dtype);
// Throws InvalidArgumentError when the mode cannot make (op, dtype) reproducible (PROD over a
// floating dtype), naming both.
void checkReproducible(ReduceOp op, DType dtype);

// The collectives of collectives.h in reproducible mode, for SUM and AVG over floating dtypes
// (collectives.h routes there when CollectiveOptions::reproducible or
// ContextOptions::reproducible is set). Same arguments, same in-place rules.
void reproducibleAllreduce(Context& ctx, const void* in, void* out, size_t count, DType dtype,
                           ReduceOp op, const CollectiveOptions& opts);
void reproducibleReduce(Context& ctx, const void* in, void* out, size_t count, DType dtype,
                        ReduceOp op, int root, const CollectiveOptions& opts);
void reproducibleReduceScatterv(Context& ctx, const void* in, void* out,
                                std::span<const size_t> counts, DType dtype, ReduceOp op,
                                const CollectiveOptions& opts);

// The arithmetic alone, for tests and for callers that hold every rank's inputs in one process:
// out[i] = the reproducible reduction of inputs[r][i] over r (inputs.size() ranks), exactly as
// the collectives compute it. `path` forces the one-pass or the windowed path (kAuto: by size,
// as the collectives choose, float32's double sums included); `refined`, when not null,
// receives how many elements the forced windowed path had to refine (kAuto: 0).
// kWindowed: the int64 window alone (no double sums); kPair: the two-rank IEEE arithmetic
// (exactly two inputs, InvalidArgumentError otherwise), what kAuto takes for two inputs.
enum class ReproduciblePath : uint8_t { kAuto, kOnePass, kWindowed, kPair };
void reproducibleReduceLocal(std::span<const void* const> inputs, void* out, size_t count,
                             DType dtype, ReduceOp op,
                             ReproduciblePath path = ReproduciblePath::kAuto,
                             size_t* refined = nullptr);

}  // namespace loom::comm
