// Reproducible reductions: SUM and AVG over float32, float64, float16 and bfloat16 whose result
// is the correctly rounded exact sum (or exact sum / world size) of every rank's inputs,
// element by element, and therefore bitwise the same whatever the algorithm, transport,
// hierarchy, chunk size, tuning, arrival order or assignment of the inputs to ranks
// (docs/reproducible.md).
//
// How it works: the floats are never added. Each rank turns its values into integers of a
// fixed-point format all ranks agree on, the existing reductions add those integers with int64
// SUM (integer addition is associative and exact here, so every algorithm gives the same
// integers), and each output element is rounded once from the integer sum.
// - Two ranks (pair): for two values, one IEEE addition in round-to-nearest is the correctly
//   rounded sum, and it commutes, so nothing needs integers: the raw values travel (all-reduce:
//   an all-gather per 4 MiB chunk; reduce: a gather to the root; reduce-scatter: an all-to-all
//   of the blocks) and each rank adds the pair itself, in the default floating-point
//   environment (AVG through double, rounded once: see comm/src/reproducible_pair.cc for why
//   each dtype's arithmetic is exact). The wire carries what the default collective carries.
// From three ranks on:
// - Small buffers (one-pass, at most kReproducibleOnePassBytes of accumulators): every value
//   becomes a full exact accumulator: signed 52-bit digits in int64 words covering the
//   format's whole range (float32 and bfloat16: 6 digits, float16: 1, float64: 41) plus one
//   word counting NaN, +inf, -inf and -0 inputs. One all-reduce (reduce-scatter, reduce).
// - All-reduce and reduce at the one-pass sizes, over few ranks (gathered: a raw value takes
//   fewer bytes than a full accumulator, n * dtype size < 8 * words): the raw values travel
//   instead. Each rank writes its input into its own slot of an otherwise zero
//   buffer of n slots, the ranks all-reduce (reduce) the bytes with uint8 MAX, which is a
//   gather through the all-reduce's small-message path, and each rank reduces the n rows
//   exactly in place (the windowed arithmetic below, done locally). One collective.
// - Larger buffers (windowed): pass 1 all-reduces, with uint8 MAX, one byte per element coding
//   its largest exponent over the ranks (float64: in groups of 16 exponents); pass 2 reduces
//   each value truncated toward zero into a window anchored there: 41 value bits in one int64
//   for float32, bfloat16 and float16, 93 bits in two for float64 (a narrow window, 28 value
//   bits and 2 count bits in one int32 for float32 over two inputs, is left to
//   reproducibleReduceLocal's kNarrow: collectives over two ranks take the pair path). The window's
//   low 11 bits count the ranks that dropped nonzero bits below it (c); each dropped less than one
//   unit, so the exact sum lies strictly between (T - c) and (T + c) units. Rounding is monotonic:
//   where both ends round to the same value, that is the answer (c = 0: T is exact). Every rank
//   that holds T sees the same undecided elements (near a rounding midpoint, heavy
//   cancellation, inf or NaN anywhere); only those are reduced again, with full accumulators,
//   after their indices are shared (reduce: broadcast from the root; reduce-scatter:
//   all-gather). float16's window covers its whole range: it is always exact in pass 2.
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
// - Two ranks: one collective per 4 MiB of input (all-reduce, reduce), one for reduce-scatter.
//   From three ranks on, a call runs up to five collectives (bytes, window, list of undecided
//   elements, their accumulators), each with the caller's timeout and seq; all-reduce and reduce
//   run the first two once per 512 KiB of window digits (65,536 float32 elements) for larger
//   buffers.
// - Speed: the float32 conversions run in AVX2 where the reduce kernels do (reduceKernelIsa()),
//   with the same bits as the scalar loops (ReduceIsa::kGeneric).
// - Wire cost per element, before the algorithm's own factor (ring: 2(n-1)/n), from three ranks
//   on (two ranks: the dtype's own size, as the default collective): windowed
//   float32 / bfloat16 / float16 1 + 8 = 9 bytes (4.5x float16's and bfloat16's 2, 2.25x
//   float32's 4), float64 1 + 16 = 17 bytes (2.1x), plus, for each refined element, its index
//   (8 bytes, reduce and reduce-scatter only) and a full accumulator: 56 bytes (float32,
//   bfloat16), 16 (float16), 336 (float64). One-pass: 56, 56, 16 and 336 bytes per element
//   (float32, bfloat16, float16, float64). Reduce-scatter's pass 1 covers the whole input.
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
// as the collectives choose); `refined`, when not null, receives how many elements the
// windowed path had to refine.
// kWindowed: the wide window; kNarrow: the narrow int32 window where the world allows it
// (float32, up to two ranks), else the wide one; kPair: the two-rank IEEE arithmetic (exactly two
// inputs, InvalidArgumentError otherwise), what kAuto takes for two inputs.
enum class ReproduciblePath : uint8_t { kAuto, kOnePass, kWindowed, kNarrow, kPair };
void reproducibleReduceLocal(std::span<const void* const> inputs, void* out, size_t count,
                             DType dtype, ReduceOp op,
                             ReproduciblePath path = ReproduciblePath::kAuto,
                             size_t* refined = nullptr);

}  // namespace loom::comm
