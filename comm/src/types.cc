#include "loom/comm/types.h"

#include <cstdint>
#include <string>

#include "loom/common/error.h"

namespace loom {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace

void throwUnknownDType(DType dtype) {
  LOOM_THROW(InvalidArgumentError, "unknown dtype value ", static_cast<int>(dtype));
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kFloat16:
      return "half";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

DType parseDType(std::string_view name) {
  const std::string n = lower(name);
  if (n == "float" || n == "float32" || n == "fp32" || n == "f32") return DType::kFloat32;
  if (n == "double" || n == "float64" || n == "fp64" || n == "f64") return DType::kFloat64;
  if (n == "half" || n == "float16" || n == "fp16" || n == "f16") return DType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  if (n == "int8" || n == "char" || n == "i8") return DType::kInt8;
  if (n == "uint8" || n == "byte" || n == "u8") return DType::kUInt8;
  if (n == "int32" || n == "int" || n == "i32") return DType::kInt32;
  if (n == "int64" || n == "long" || n == "i64") return DType::kInt64;
  if (n == "bool") return DType::kBool;
  LOOM_THROW(InvalidArgumentError, "unknown dtype '", name,
             "'; expected one of float (float32, fp32), double (float64, fp64), half (float16, "
             "fp16), bfloat16 (bf16), int8, uint8, int32 (int), int64 (long), bool");
}

bool isFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

bool isInteger(DType dtype) {
  return !isFloatingPoint(dtype);
}

const char* opTypeName(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kReduce:
      return "reduce";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kGather:
      return "gather";
    case OpType::kScatter:
      return "scatter";
    case OpType::kAlltoall:
      return "alltoall";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    case OpType::kAlltoallv:
      return "alltoallv";
    case OpType::kAllgatherv:
      return "allgatherv";
    case OpType::kGatherv:
      return "gatherv";
    case OpType::kReduceScatterv:
      return "reduce_scatterv";
    case OpType::kAllreduceCoalesced:
      return "allreduce_coalesced";
    case OpType::kMonitoredBarrier:
      return "monitored_barrier";
  }
  return static_cast<uint8_t>(type) == 0 ? "none" : "unknown";
}

bool isCollective(OpType type) {
  return type != OpType::kSend && type != OpType::kRecv;
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kBand:
      return "band";
    case ReduceOp::kBor:
      return "bor";
    case ReduceOp::kBxor:
      return "bxor";
  }
  return "unknown";
}

ReduceOp parseReduceOp(std::string_view name) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  if (n == "band" || n == "and") return ReduceOp::kBand;
  if (n == "bor" || n == "or") return ReduceOp::kBor;
  if (n == "bxor" || n == "xor") return ReduceOp::kBxor;
  LOOM_THROW(InvalidArgumentError, "unknown reduce op '", name,
             "'; expected one of sum, prod, min, max, avg, band, bor, bxor");
}

bool isBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

void checkReduceOp(ReduceOp op, DType dtype) {
  // The common case in two compares: sum, prod, min, max or avg on a non-bool dtype.
  if (op <= ReduceOp::kAvg && dtype < DType::kBool) return;
  LOOM_CHECK(static_cast<uint8_t>(op) <= static_cast<uint8_t>(ReduceOp::kBxor),
             "unknown reduce op value ", static_cast<int>(op));
  (void)dtypeSize(dtype);  // rejects unknown dtype values
  if (isBitwise(op) && !isInteger(dtype)) {
    LOOM_THROW(InvalidArgumentError, "reduce op ", reduceOpName(op), " is bitwise and needs an ",
               "integer dtype (int8, uint8, int32, int64, bool), got ", dtypeName(dtype));
  }
  if (dtype == DType::kBool && op == ReduceOp::kAvg) {
    LOOM_THROW(InvalidArgumentError,
               "reduce op avg is not defined for dtype bool; use sum (logical or) or an integer "
               "dtype");
  }
}

std::string deviceName(Device device) {
  if (device.type == DeviceType::kCpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

// view<T>: the dtype is chosen by a trait; the explicit instantiations below are the
// supported element types (uint16_t is not one: fp16 and bf16 both use it, so build those
// views by hand with the dtype named).
namespace {
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
}  // namespace

template <typename T>
BufferView view(T* data, size_t count, Device device) {
  return BufferView{const_cast<void*>(static_cast<const void*>(data)), count,
                    DTypeOf<std::remove_const_t<T>>::value, device};
}

#define LOOM_VIEW_INSTANTIATE(T)                   \
  template BufferView view<T>(T*, size_t, Device); \
  template BufferView view<const T>(const T*, size_t, Device);
LOOM_VIEW_INSTANTIATE(float)
LOOM_VIEW_INSTANTIATE(double)
LOOM_VIEW_INSTANTIATE(int8_t)
LOOM_VIEW_INSTANTIATE(uint8_t)
LOOM_VIEW_INSTANTIATE(int32_t)
LOOM_VIEW_INSTANTIATE(int64_t)
LOOM_VIEW_INSTANTIATE(bool)
#undef LOOM_VIEW_INSTANTIATE

}  // namespace loom
