// NcclApi: the CUDA runtime and NCCL calls the nccl backend makes, behind one small interface, so
// that everything around them (the (dtype, op) mapping, point-to-point grouping, the stream
// choice, the event pool, waits, unique-id versioning, the watchdog's abort) is unit-tested
// without a GPU on a fake device (tests/process_group/nccl_fake.h). Free of CUDA and NCCL
// headers: handles are opaque pointers, NCCL's enums are mirrored with NCCL's own values
// (nccl_api_cuda.cc static_asserts them).
//
// Contract
// - cudaApi() (nccl_api_cuda.cc, only with LOOM_HAVE_NCCL) is the real one: each call is the CUDA
//   or NCCL function of the same name. CUDA calls that fail throw IoError naming the call and
//   CUDA's message; NCCL calls return NCCL's result code (kNcclSuccess, kNcclInProgress, ...),
//   which the caller settles against its deadline (the communicator is non-blocking).
// - Thread-safety: as CUDA's and NCCL's (any thread; one communicator used by one thread at a
//   time, which the backend guarantees with its state lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/comm/types.h"

namespace loom::nccl_detail {

// ncclDataType_t and ncclRedOp_t, with NCCL's values.
enum class NcclType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};
enum class NcclOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
const char* ncclTypeName(NcclType type);  // "ncclUint8", ...
const char* ncclOpName(NcclOp op);        // "ncclMax", ...

// NCCL's result codes the backend tells apart; any other value is an error.
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;

// The NCCL type that moves `dtype` (bool as its one byte).
NcclType ncclTypeOf(DType dtype);

// How a reduction of `dtype` with `op` runs on NCCL, with c10d's semantics:
// - bool is one byte holding 0 or 1 (as torch's). SUM and MAX are logical OR, run as ncclMax on
//   the bytes; PROD and MIN are logical AND, run as ncclMin; BOR / BAND likewise. The bytes are
//   not normalised (Loom has no kernels): a byte other than 0/1 still reads as true, and the
//   result is correct as a truth value, but holds the largest (OR) or smallest (AND) byte.
// - AVG: ncclAvg, for floating types and integers (NCCL divides the integer sum by the size,
//   truncating, as the comm backend does); refused for bool (InvalidArgumentError).
// - bitwise ops on integers, and BXOR on bool: NCCL has none; InvalidArgumentError naming the
//   op, the dtype and the reason.
struct NcclReduction {
  NcclType type;
  NcclOp op;
};
NcclReduction ncclReductionOf(const std::string& who, const char* opName, DType dtype, ReduceOp op);

using Stream = void*;  // a cudaStream_t
using Event = void*;   // a cudaEvent_t
using Comm = void*;    // an ncclComm_t

// CUDA's special stream handles (cuda_runtime_api.h: cudaStreamLegacy, cudaStreamPerThread).
inline Stream legacyDefaultStream() {
  return reinterpret_cast<Stream>(uintptr_t{1});
}
inline Stream perThreadDefaultStream() {
  return reinterpret_cast<Stream>(uintptr_t{2});
}

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // --- CUDA (throws IoError on failure) ---
  // Visible devices; 0 when there is none or no driver (never throws).
  virtual int deviceCount() = 0;
  // Why deviceCount() is 0, for the error that says so: CUDA's own error when it gave one (a
  // driver older than the runtime, devices busy in exclusive mode, ...), not just "none".
  virtual std::string whyNoDevice() { return "cudaGetDeviceCount found none"; }
  // The calling thread's current device; -1 when it cannot be read (never throws).
  virtual int currentDevice() = 0;
  virtual void setDevice(int device) = 0;
  // A stream that does not synchronize with the legacy default stream (cudaStreamNonBlocking).
  virtual Stream createStream() = 0;
  virtual void destroyStream(Stream stream) noexcept = 0;
  // cudaStreamQuery: true when everything queued on `stream` is done.
  virtual bool streamIdle(Stream stream) = 0;
  // Timing disabled; blocking sync, so that synchronizeEvent sleeps instead of spinning.
  virtual Event createEvent() = 0;
  virtual void destroyEvent(Event event) noexcept = 0;
  virtual void recordEvent(Event event, Stream stream) = 0;
  // Work queued on `stream` after this call waits for `event`'s latest record.
  virtual void streamWaitEvent(Stream stream, Event event) = 0;
  enum class EventState { kPending, kDone, kFailed };
  // cudaEventQuery (never blocks); `error` set when kFailed.
  virtual EventState queryEvent(Event event, std::string& error) = 0;
  // cudaEventSynchronize: sleeps until the event's work is done (or failed: IoError).
  virtual void synchronizeEvent(Event event) = 0;
  virtual void* deviceAlloc(size_t bytes) = 0;
  virtual void deviceFree(void* ptr) noexcept = 0;

  // --- NCCL (result codes) ---
  virtual size_t uniqueIdBytes() = 0;
  virtual int getUniqueId(std::string& id) = 0;
  // ncclCommInitRankConfig with blocking = 0.
  virtual int commInitRank(Comm* comm, int size, const std::string& id, int rank) = 0;
  virtual int commGetAsyncError(Comm comm, int* state) = 0;
  virtual int commAbort(Comm comm) noexcept = 0;
  virtual int commDestroy(Comm comm) noexcept = 0;
  virtual std::string errorString(int result) = 0;
  virtual std::string lastError(Comm comm) = 0;
  virtual int groupStart() = 0;
  virtual int groupEnd() = 0;
  virtual int allReduce(const void* in, void* out, size_t count, NcclType type, NcclOp op,
                        Comm comm, Stream stream) = 0;
  virtual int broadcast(const void* in, void* out, size_t count, NcclType type, int root, Comm comm,
                        Stream stream) = 0;
  virtual int reduce(const void* in, void* out, size_t count, NcclType type, NcclOp op, int root,
                     Comm comm, Stream stream) = 0;
  virtual int allGather(const void* in, void* out, size_t count, NcclType type, Comm comm,
                        Stream stream) = 0;
  virtual int reduceScatter(const void* in, void* out, size_t recvCount, NcclType type, NcclOp op,
                            Comm comm, Stream stream) = 0;
  virtual int send(const void* buf, size_t count, NcclType type, int peer, Comm comm,
                   Stream stream) = 0;
  virtual int recv(void* buf, size_t count, NcclType type, int peer, Comm comm, Stream stream) = 0;
};

// The CUDA runtime and NCCL (nccl_api_cuda.cc; only built with LOOM_HAVE_NCCL).
std::shared_ptr<NcclApi> cudaApi();

}  // namespace loom::nccl_detail
