// The comm vocabulary shared by every layer above: element types, reduce operations, devices
// and buffer views. The comm stack speaks BufferView (pointer, count, dtype, device), never a
// tensor type, so any tensor library can pass its memory without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
};

[[noreturn]] void throwUnknownDType(DType dtype);  // InvalidArgumentError naming the value
// Bytes per element; throws InvalidArgumentError for a value outside the enum.
inline size_t dtypeSize(DType dtype) {
  constexpr uint8_t kSizes[] = {4, 8, 2, 2, 1, 1, 4, 8, 1};  // in DType's order
  const auto index = static_cast<size_t>(dtype);
  if (index < sizeof(kSizes)) return kSizes[index];
  throwUnknownDType(dtype);
}
static_assert(static_cast<int>(DType::kBool) == 8, "dtypeSize's table follows DType's order");
// Canonical names as nccl-tests prints them: float, double, half, bfloat16, int8, uint8,
// int32, int64, bool.
const char* dtypeName(DType dtype);
// Accepts the canonical names and common aliases (float32, fp32, f32, float64, fp16, bf16,
// int, long, ...). Throws InvalidArgumentError listing the accepted names otherwise.
DType parseDType(std::string_view name);
bool isFloatingPoint(DType dtype);
bool isInteger(DType dtype);  // int8 ... int64 and bool

enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg, kBand, kBor, kBxor };

const char* reduceOpName(ReduceOp op);  // sum, prod, min, max, avg, band, bor, bxor
ReduceOp parseReduceOp(std::string_view name);
bool isBitwise(ReduceOp op);
// Throws InvalidArgumentError when `op` is not defined for `dtype` (bitwise ops on floats).
void checkReduceOp(ReduceOp op, DType dtype);

// Every operation a group runs, one vocabulary for every layer: the comm algorithms and their
// message tags, the shared-memory arena's mismatch checks and the ProcessGroup's Work. Values
// start at 1 so that 0 reads as "no operation" in tags and shared state.
enum class OpType : uint8_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kSend,
  kRecv,
  // Uneven counts (c10d's split sizes and list forms): every rank passes every rank's count.
  kAlltoallv,
  kAllgatherv,
  kGatherv,
  kReduceScatterv,
  // Many buffers of one dtype reduced as one operation (the ProcessGroup packs them).
  kAllreduceCoalesced,
  // A barrier through the store that names the ranks that did not arrive (ProcessGroup).
  kMonitoredBarrier,
};
// "allreduce", "reduce_scatter", "send", ...; "none" for 0, "unknown" for other values.
const char* opTypeName(OpType type);
bool isCollective(OpType type);  // everything but send / recv

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  // CUDA ordinal; -1 for CPU
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceType::kCuda, index}; }
};
std::string deviceName(Device device);  // "cpu", "cuda:0"

// A view of caller-owned memory: `count` elements of `dtype` at `data`.
struct BufferView {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device = {};

  size_t bytes() const { return count * dtypeSize(dtype); }
};

// A typed view from a pointer: view(ptr, n) for float*, double*, int32_t*, ...
template <typename T>
BufferView view(T* data, size_t count, Device device = {});

}  // namespace loom
