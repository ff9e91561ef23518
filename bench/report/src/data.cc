#include "loom/bench/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "loom/common/error.h"

namespace loom::bench {
namespace {

template <typename T>
void put(void* base, size_t index, T value) {
  std::memcpy(static_cast<char*>(base) + index * sizeof(T), &value, sizeof(T));
}

template <typename T>
T get(const void* base, size_t index) {
  T value;
  std::memcpy(&value, static_cast<const char*>(base) + index * sizeof(T), sizeof(T));
  return value;
}

// The largest integer the type represents exactly (capped: fills stay tiny anyway).
double exactLimit(ElemType type) {
  switch (type) {
    case ElemType::kInt8:
      return 127;
    case ElemType::kUInt8:
      return 255;
    case ElemType::kBFloat16:
      return 256;
    case ElemType::kHalf:
      return 2048;
    default:
      return 1 << 24;
  }
}

bool isReduction(Op op) {
  return opUsesRedop(op);
}

double tolerance(ElemType type) {
  switch (type) {
    case ElemType::kHalf:
      return 4.0 / 1024;
    case ElemType::kBFloat16:
      return 4.0 / 128;
    case ElemType::kFloat:
      return 4.0 / (1 << 23);
    case ElemType::kDouble:
      return 1e-13;
    default:
      return 0;
  }
}

}  // namespace

uint16_t floatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t bits = x & 0x7fffffffu;
  if (bits >= 0x7f800000u) {  // inf or NaN (keep NaN quiet)
    return static_cast<uint16_t>(sign | 0x7c00u | (bits > 0x7f800000u ? 0x200u : 0u));
  }
  if (bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (bits < 0x38800000u) {  // below 2^-14: a half subnormal, in units of 2^-24
    float magnitude;
    std::memcpy(&magnitude, &bits, sizeof(magnitude));
    const auto units = static_cast<uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    return static_cast<uint16_t>(sign | units);
  }
  const uint32_t exponent = (bits >> 23) - 127 + 15;
  const uint32_t mantissa = bits & 0x7fffffu;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carries into the exponent
  return static_cast<uint16_t>(sign | half);
}

float halfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  uint32_t x;
  if (exponent == 31) {
    x = sign | 0x7f800000u | (mantissa << 13);
  } else {
    x = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &x, sizeof(out));
  return out;
}

uint16_t floatToBFloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bfloat16ToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &x, sizeof(out));
  return out;
}

void storeElem(ElemType type, void* base, size_t index, double value) {
  switch (type) {
    case ElemType::kFloat:
      return put<float>(base, index, static_cast<float>(value));
    case ElemType::kDouble:
      return put<double>(base, index, value);
    case ElemType::kHalf:
      return put<uint16_t>(base, index, floatToHalf(static_cast<float>(value)));
    case ElemType::kBFloat16:
      return put<uint16_t>(base, index, floatToBFloat16(static_cast<float>(value)));
    case ElemType::kInt8:
      return put<int8_t>(base, index, static_cast<int8_t>(value));
    case ElemType::kUInt8:
      return put<uint8_t>(base, index, static_cast<uint8_t>(value));
    case ElemType::kInt32:
      return put<int32_t>(base, index, static_cast<int32_t>(value));
    case ElemType::kInt64:
      return put<int64_t>(base, index, static_cast<int64_t>(value));
  }
}

double loadElem(ElemType type, const void* base, size_t index) {
  switch (type) {
    case ElemType::kFloat:
      return get<float>(base, index);
    case ElemType::kDouble:
      return get<double>(base, index);
    case ElemType::kHalf:
      return halfToFloat(get<uint16_t>(base, index));
    case ElemType::kBFloat16:
      return bfloat16ToFloat(get<uint16_t>(base, index));
    case ElemType::kInt8:
      return get<int8_t>(base, index);
    case ElemType::kUInt8:
      return get<uint8_t>(base, index);
    case ElemType::kInt32:
      return get<int32_t>(base, index);
    case ElemType::kInt64:
      return static_cast<double>(get<int64_t>(base, index));
  }
  return 0;
}

namespace {

// splitmix64's finaliser: neighbouring inputs give unrelated outputs, so fills have no period
// that a misplaced slice could hide behind.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hashOf(size_t rank, size_t index, uint64_t salt) {
  return mix(mix(index ^ (salt << 56)) + rank);
}

}  // namespace

double fillValue(Op op, RedOp redop, ElemType type, int rank, int worldSize, size_t index) {
  const size_t r = static_cast<size_t>(rank);
  const size_t n = static_cast<size_t>(worldSize);
  if (!isReduction(op)) return static_cast<double>(hashOf(r, index, 1) % 11);
  switch (redop) {
    case RedOp::kSum: {
      const size_t k = std::min<size_t>(4, static_cast<size_t>(exactLimit(type)) / n + 1);
      return static_cast<double>(hashOf(r, index, 2) % k);
    }
    case RedOp::kProd: {
      const uint64_t h = hashOf(0, index, 3);
      return h % n == r ? static_cast<double>(1 + (h >> 32) % 3) : 1.0;
    }
    case RedOp::kMin:
    case RedOp::kMax:
      return static_cast<double>(hashOf(r, index, 4) % 7);
    case RedOp::kAvg: {
      const double base = static_cast<double>(1 + hashOf(0, index, 5) % 3);
      if (n % 2 == 1 && r == n - 1) return base;
      return r % 2 == 0 ? base + 1 : base - 1;
    }
  }
  return 0;
}

double reducedValue(Op op, RedOp redop, ElemType type, int worldSize, size_t index) {
  double acc = fillValue(op, redop, type, 0, worldSize, index);
  for (int q = 1; q < worldSize; ++q) {
    const double v = fillValue(op, redop, type, q, worldSize, index);
    switch (redop) {
      case RedOp::kSum:
      case RedOp::kAvg:
        acc += v;
        break;
      case RedOp::kProd:
        acc *= v;
        break;
      case RedOp::kMin:
        acc = std::min(acc, v);
        break;
      case RedOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  return redop == RedOp::kAvg ? acc / worldSize : acc;
}

void fillInput(Op op, RedOp redop, ElemType type, int rank, int worldSize, void* base, size_t count,
               size_t first) {
  for (size_t i = 0; i < count; ++i) {
    storeElem(type, base, i, fillValue(op, redop, type, rank, worldSize, first + i));
  }
}

void fillGradients(ElemType type, int rank, void* base, size_t count) {
  if (!isFloatType(type)) {
    const size_t r = static_cast<size_t>(rank);
    for (size_t i = 0; i < count; ++i) {
      storeElem(type, base, i, static_cast<double>(hashOf(r, i, 6) % 7) - 3.0);
    }
    return;
  }
  std::mt19937_64 shared(0x6c6f6f6d), own(0x72616e6b + static_cast<uint64_t>(rank));
  // One distribution per engine: a distribution may keep a draw for its next call.
  std::normal_distribution<double> zShared, zOwn;
  for (size_t i = 0; i < count; ++i) {
    storeElem(type, base, i, 0.01 * (zShared(shared) + zOwn(own)));
  }
}

bool matches(ElemType type, RedOp redop, bool reduction, double got, double expected) {
  if (got == expected) return true;
  if (!reduction || redop != RedOp::kAvg || !isFloatType(type)) return false;
  return std::fabs(got - expected) <= tolerance(type) * std::max(1.0, std::fabs(expected));
}

int64_t countWrong(Op op, RedOp redop, ElemType type, int rank, int worldSize, int root,
                   const Layout& layout, const void* out) {
  const size_t n = static_cast<size_t>(worldSize);
  const size_t r = static_cast<size_t>(rank);
  const size_t piece = layout.opCount;
  const bool reduction = isReduction(op);
  auto expectedAt = [&](size_t j) -> double {
    switch (op) {
      case Op::kAllReduce:
      case Op::kReduce:
        return reducedValue(op, redop, type, worldSize, j);
      case Op::kReduceScatter:
        return reducedValue(op, redop, type, worldSize, r * piece + j);
      case Op::kBroadcast:
        return fillValue(op, redop, type, root, worldSize, j);
      case Op::kAllGather:
      case Op::kGather:
        return fillValue(op, redop, type, static_cast<int>(j / piece), worldSize, j % piece);
      case Op::kScatter:
        return fillValue(op, redop, type, root, worldSize, r * piece + j);
      case Op::kAllToAll:
        return fillValue(op, redop, type, static_cast<int>(j / piece), worldSize,
                         r * piece + j % piece);
      case Op::kSendRecv:
        return fillValue(op, redop, type, static_cast<int>((r + n - 1) % n), worldSize, j);
      case Op::kBarrier:
        return 0;
    }
    return 0;
  };
  if (op == Op::kBarrier) return 0;
  if ((op == Op::kReduce || op == Op::kGather) && rank != root) return 0;
  int64_t wrong = 0;
  for (size_t j = 0; j < layout.recvCount; ++j) {
    if (!matches(type, redop, reduction, loadElem(type, out, j), expectedAt(j))) ++wrong;
  }
  return wrong;
}

}  // namespace loom::bench
