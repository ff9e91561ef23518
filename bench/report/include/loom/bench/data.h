// Check data for `-c 1`: every rank fills its input with small integers chosen per operation
// and reduction so that the exact result is representable in every element type (half and
// bfloat16 included) and cannot overflow int8, and every rank can compute what every other
// rank sent. Then each rank counts the output elements that differ from the exact result.
//
// Fills, for rank r of n at input index i (the index into the whole input buffer), with h a
// 64-bit mixing hash of (r, i) so that no fill repeats with a period a misplaced slice could
// hide behind:
//   sum         h mod k, with k = min(4, L / n + 1) where L is the largest integer the type
//               holds exactly (int8 127, uint8 255, bfloat16 256, half 2048, ...), so that no
//               partial sum exceeds L.
//   prod        1 + (h(i) >> 32) mod 3 on rank h(i) mod n, 1 on the others: products 1 to 3.
//   min, max    h mod 7.
//   avg         1 + h(i) mod 3, plus 1 on even ranks and minus 1 on odd ranks (0 on the last
//               rank when n is odd): the sum is n times an integer, so the average is exact
//               for integer types; floating types allow a relative error of a few units in the
//               last place because a library may multiply by 1/n. Partial sums stay below 4n
//               (exact in int8 up to 31 ranks).
//   data movement (broadcast, gathers, scatter, alltoall, sendrecv)   h mod 11.
// Outputs start as all-ones bytes (NaN for floating types, -1 or 255 for integers), which no
// fill produces, so an element the collective never wrote is counted wrong.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/bench/types.h"

namespace loom::bench {

// Element access through double: exact for the small integers the fills use.
void storeElem(ElemType type, void* base, size_t index, double value);
double loadElem(ElemType type, const void* base, size_t index);

uint16_t floatToHalf(float value);  // round to nearest even
float halfToFloat(uint16_t bits);
uint16_t floatToBFloat16(float value);  // round to nearest even
float bfloat16ToFloat(uint16_t bits);

// The value rank `rank` puts at input index `index`.
double fillValue(Op op, RedOp redop, ElemType type, int rank, int worldSize, size_t index);
// reduce over all ranks of fillValue(op, redop, type, q, n, index).
double reducedValue(Op op, RedOp redop, ElemType type, int worldSize, size_t index);

// Writes fillValue(rank, first + i) at elements [0, count) of base.
void fillInput(Op op, RedOp redop, ElemType type, int rank, int worldSize, void* base, size_t count,
               size_t first = 0);

// Gradient-like values for --touch-values gradients (timing only, never checked): element i of
// rank r is 0.01 (z_i + z_ri), with z_i a standard normal draw shared by every rank and z_ri
// one of rank r's own, as data-parallel ranks' gradients share the model and differ by batch;
// integer types get h mod 7 - 3 (h a hash of rank and index). Deterministic per (rank, count).
void fillGradients(ElemType type, int rank, void* base, size_t count);

// Number of elements of `out` (the output buffer of `rank`, recvCount elements of the layout)
// that differ from the exact result of `op`. Ranks with no defined output (non-roots of
// reduce and gather) return 0.
int64_t countWrong(Op op, RedOp redop, ElemType type, int rank, int worldSize, int root,
                   const Layout& layout, const void* out);

// Whether `got` matches `expected` for this type and reduction (exact, except avg on floats).
bool matches(ElemType type, RedOp redop, bool reduction, double got, double expected);

}  // namespace loom::bench
