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
// - Small buffers (one-pass, at most kReproducibleOnePassBytes of accumulators): every value
//   becomes a full exact accumulator: signed 52-bit digits in int64 words covering the
//   format's whole range (float32 and bfloat16: 6 digits, float16: 1, float64: 41) plus one
//   word counting NaN, +inf, -inf and -0 inputs. One all-reduce (reduce-scatter, reduce).
// - Larger buffers (windowed): pass 1 all-reduces, with uint8 MAX, one byte per element coding
//   its largest exponent over the ranks; pass 2 reduces each value truncated to a window of
//   52-bit digits anchored at that exponent (1 digit for float32, bfloat16 and float16, 2 for
//   float64). The bits a rank dropped below the window total less than n * 2^lsb, so the exact
//   sum lies strictly between (T - n) and (T + n) window units; where both ends round to the
//   same value (rounding is monotonic) that is the answer. Every rank that holds T sees the
//   same undetermined elements; only those are reduced again, with full accumulators.
//   float16's window holds its whole range: it is exact in pass 2.
//
// Contract
// - Collective and blocking like collectives.h; every rank passes the same arguments.
// - Results: the sum rounded to nearest, ties to even, with IEEE overflow to infinity. AVG is
//   round(exact sum / n), one rounding (not round(round(sum) / n)). Special values: any NaN,
//   or +inf and -inf together, give NaN (the canonical quiet NaN, sign clear, payload 0);
//   otherwise any +inf gives +inf, any -inf gives -inf. An exact zero sum is -0 when every
//   input is -0, else +0 (as IEEE's sum in round-to-nearest).
// - World size at most kReproducibleMaxWorldSize (digits of n ranks add without overflow).
// - Wire cost per element, before the algorithm's own factor (ring: 2(n-1)/n): float32 /
//   bfloat16 / float16 1 + 8 = 9 bytes, float64 1 + 16 = 17 bytes, plus 56 bytes (float32,
//   bfloat16), 16 (float16) or 336 (float64) for each element that needs refining. One-pass:
//   56, 16, 56 and 336 bytes.
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
enum class ReproduciblePath : uint8_t { kAuto, kOnePass, kWindowed };
void reproducibleReduceLocal(std::span<const void* const> inputs, void* out, size_t count,
                             DType dtype, ReduceOp op,
                             ReproduciblePath path = ReproduciblePath::kAuto,
                             size_t* refined = nullptr);

}  // namespace loom::comm
