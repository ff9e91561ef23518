// Test helpers for the comm sweeps: typed element access through doubles / int64, the fill
// pattern of each rank, and the closed-form reference reduction.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/comm/types.h"

namespace loom::comm::testing {

// Element i of a `dtype` buffer, read or written with memcpy: the buffer may be any byte
// array (a uint8_t scratch on the stack, a byte vector), with no alignment for the type.
template <typename T>
inline void storeAt(void* buf, size_t i, T value) {
  std::memcpy(static_cast<uint8_t*>(buf) + i * sizeof(T), &value, sizeof(T));
}
template <typename T>
inline T loadAt(const void* buf, size_t i) {
  T value;
  std::memcpy(&value, static_cast<const uint8_t*>(buf) + i * sizeof(T), sizeof(T));
  return value;
}

// Stores `value` (an integer) as element i of a `dtype` buffer (integers wrap modulo 2^bits).
inline void setElem(void* buf, size_t i, DType dtype, int64_t value) {
  switch (dtype) {
    case DType::kFloat32:
      storeAt(buf, i, static_cast<float>(value));
      break;
    case DType::kFloat64:
      storeAt(buf, i, static_cast<double>(value));
      break;
    case DType::kFloat16:
      storeAt(buf, i, floatToHalf(static_cast<float>(value)));
      break;
    case DType::kBFloat16:
      storeAt(buf, i, floatToBFloat16(static_cast<float>(value)));
      break;
    case DType::kInt8:
      storeAt(buf, i, static_cast<int8_t>(value));
      break;
    case DType::kUInt8:
      storeAt(buf, i, static_cast<uint8_t>(value));
      break;
    case DType::kInt32:
      storeAt(buf, i, static_cast<int32_t>(value));
      break;
    case DType::kInt64:
      storeAt(buf, i, value);
      break;
    case DType::kBool:
      storeAt(buf, i, static_cast<uint8_t>(value != 0 ? 1 : 0));
      break;
  }
}

inline double getElem(const void* buf, size_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return loadAt<float>(buf, i);
    case DType::kFloat64:
      return loadAt<double>(buf, i);
    case DType::kFloat16:
      return halfToFloat(loadAt<uint16_t>(buf, i));
    case DType::kBFloat16:
      return bfloat16ToFloat(loadAt<uint16_t>(buf, i));
    case DType::kInt8:
      return loadAt<int8_t>(buf, i);
    case DType::kUInt8:
      return loadAt<uint8_t>(buf, i);
    case DType::kInt32:
      return loadAt<int32_t>(buf, i);
    case DType::kInt64:
      return static_cast<double>(loadAt<int64_t>(buf, i));
    case DType::kBool:
      return loadAt<uint8_t>(buf, i);
  }
  return 0;
}

// The value rank `rank` contributes at index i for reduce op `op` (small integers, exact in
// every dtype, so that sums, products, minima and maxima are exact too).
inline int64_t fillValue(int rank, size_t i, ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) return (rank + i) % 3 != 0 ? 1 : 0;
  switch (op) {
    case ReduceOp::kProd:
      return (rank + i) % 3 == 0 ? 2 : 1;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<int64_t>((rank * 7 + i * 3) % 11);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return static_cast<int64_t>((rank * 37 + i * 11) & 0x7f);
    default:
      return static_cast<int64_t>(rank + 1 + i % 7);
  }
}

// Reference reduction over ranks 0..size-1 of fillValue at index i, computed exactly in
// int64 (integers then wrap when stored) and returned as the double the dtype holds.
inline double expectedReduce(int size, size_t i, ReduceOp op, DType dtype) {
  int64_t acc = fillValue(0, i, op, dtype);
  for (int r = 1; r < size; ++r) {
    const int64_t v = fillValue(r, i, op, dtype);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = dtype == DType::kBool ? (acc | v) : acc + v;
        break;
      case ReduceOp::kProd:
        acc = dtype == DType::kBool ? (acc & v) : acc * v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kBand:
        acc &= v;
        break;
      case ReduceOp::kBor:
        acc |= v;
        break;
      case ReduceOp::kBxor:
        acc ^= v;
        break;
    }
  }
  uint8_t tmp[8];
  if (op == ReduceOp::kAvg) {
    if (isFloatingPoint(dtype)) return static_cast<double>(acc) / size;
    setElem(tmp, 0, dtype, acc);  // wrap first, then divide in the dtype (as the kernel does)
    const auto wrapped = static_cast<int64_t>(getElem(tmp, 0, dtype));
    setElem(tmp, 0, dtype, wrapped / size);
    return getElem(tmp, 0, dtype);
  }
  setElem(tmp, 0, dtype, acc);
  return getElem(tmp, 0, dtype);
}

// Tolerance for comparing floats: exact except for avg, which rounds (relative error of one
// unit in the last place of the dtype).
inline double tolerance(ReduceOp op, DType dtype) {
  if (op != ReduceOp::kAvg) return 0;
  switch (dtype) {
    case DType::kFloat32:
      return 1e-6;
    case DType::kFloat64:
      return 1e-14;
    case DType::kFloat16:
      return 1.0 / 1024;
    case DType::kBFloat16:
      return 1.0 / 128;
    default:
      return 0;
  }
}

inline bool close(double got, double want, double tol) {
  if (tol == 0) return got == want;
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

inline const std::vector<DType>& allDTypes() {
  static const std::vector<DType> v = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                                       DType::kBFloat16, DType::kInt8,    DType::kUInt8,
                                       DType::kInt32,    DType::kInt64,   DType::kBool};
  return v;
}

// Every op valid for the dtype.
inline std::vector<ReduceOp> validOps(DType dtype) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    if (isBitwise(op) && !isInteger(dtype)) continue;
    if (dtype == DType::kBool && op == ReduceOp::kAvg) continue;
    ops.push_back(op);
  }
  return ops;
}

}  // namespace loom::comm::testing
