// NcclApi over the CUDA runtime and NCCL (nccl_api.h): each method is the call of the same name.
// The one file of the backend that sees cuda_runtime.h and nccl.h.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "loom/common/error.h"
#include "loom/common/settings.h"
#include "nccl/nccl_api.h"
#include "nccl/nccl_backend.h"

namespace loom {

namespace nccl_detail {

static_assert(static_cast<int>(NcclType::kInt8) == ncclInt8);
static_assert(static_cast<int>(NcclType::kUint8) == ncclUint8);
static_assert(static_cast<int>(NcclType::kInt32) == ncclInt32);
static_assert(static_cast<int>(NcclType::kUint32) == ncclUint32);
static_assert(static_cast<int>(NcclType::kInt64) == ncclInt64);
static_assert(static_cast<int>(NcclType::kUint64) == ncclUint64);
static_assert(static_cast<int>(NcclType::kFloat16) == ncclFloat16);
static_assert(static_cast<int>(NcclType::kFloat32) == ncclFloat32);
static_assert(static_cast<int>(NcclType::kFloat64) == ncclFloat64);
static_assert(static_cast<int>(NcclType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(NcclOp::kSum) == ncclSum);
static_assert(static_cast<int>(NcclOp::kProd) == ncclProd);
static_assert(static_cast<int>(NcclOp::kMax) == ncclMax);
static_assert(static_cast<int>(NcclOp::kMin) == ncclMin);
static_assert(static_cast<int>(NcclOp::kAvg) == ncclAvg);
static_assert(kNcclSuccess == ncclSuccess);
static_assert(kNcclInProgress == ncclInProgress);

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) LOOM_THROW(IoError, what, " failed: ", cudaGetErrorString(err));
}

cudaStream_t st(Stream s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t ev(Event e) {
  return static_cast<cudaEvent_t>(e);
}
ncclComm_t cm(Comm c) {
  return static_cast<ncclComm_t>(c);
}
ncclDataType_t ty(NcclType t) {
  return static_cast<ncclDataType_t>(t);
}
ncclRedOp_t rop(NcclOp o) {
  return static_cast<ncclRedOp_t>(o);
}

class CudaNcclApi final : public NcclApi {
 public:
  CudaNcclApi() {
    LOOM_CHECK(legacyDefaultStream() == static_cast<Stream>(cudaStreamLegacy) &&
                   perThreadDefaultStream() == static_cast<Stream>(cudaStreamPerThread),
               "nccl_api.h's default stream handles differ from cuda_runtime.h's");
  }
  int deviceCount() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return count;
  }
  std::string whyNoDevice() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    cudaGetLastError();
    const std::string visible = settings::text("CUDA_VISIBLE_DEVICES").value_or("(unset)");
    if (err == cudaSuccess && count == 0) {
      return "cudaGetDeviceCount found none; CUDA_VISIBLE_DEVICES=" + visible;
    }
    if (err == cudaSuccess) return "";
    std::string why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err);
    if (err == cudaErrorNoDevice) why += "; CUDA_VISIBLE_DEVICES=" + visible;
    if (err == cudaErrorInsufficientDriver) {
      why += " (no NVIDIA driver is loaded, or it is older than the CUDA " +
             std::to_string(CUDART_VERSION / 1000) + "." +
             std::to_string(CUDART_VERSION % 1000 / 10) + " runtime Loom was built with)";
    }
    return why;
  }
  int currentDevice() override {
    int device = -1;
    return cudaGetDevice(&device) == cudaSuccess ? device : -1;
  }
  void setDevice(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }
  Stream createStream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroyStream(Stream stream) noexcept override { cudaStreamDestroy(st(stream)); }
  bool streamIdle(Stream stream) override {
    const cudaError_t r = cudaStreamQuery(st(stream));
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaStreamQuery");
    return true;
  }
  Event createEvent() override {
    cudaEvent_t e = nullptr;
    // Plain (not blocking-sync): cudaEventSynchronize then follows the context's scheduling
    // flags, as torch's waits do (nccl_backend.h).
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroyEvent(Event event) noexcept override { cudaEventDestroy(ev(event)); }
  void recordEvent(Event event, Stream stream) override {
    check(cudaEventRecord(ev(event), st(stream)), "cudaEventRecord");
  }
  void streamWaitEvent(Stream stream, Event event) override {
    check(cudaStreamWaitEvent(st(stream), ev(event), 0), "cudaStreamWaitEvent");
  }
  EventState queryEvent(Event event, std::string& error) override {
    const cudaError_t r = cudaEventQuery(ev(event));
    if (r == cudaSuccess) return EventState::kDone;
    if (r == cudaErrorNotReady) return EventState::kPending;
    error = cudaGetErrorString(r);
    return EventState::kFailed;
  }
  void synchronizeEvent(Event event) override {
    check(cudaEventSynchronize(ev(event)), "cudaEventSynchronize");
  }
  void* deviceAlloc(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void deviceFree(void* ptr) noexcept override { cudaFree(ptr); }

  size_t uniqueIdBytes() override { return sizeof(ncclUniqueId); }
  int getUniqueId(std::string& id) override {
    ncclUniqueId u;
    std::memset(&u, 0, sizeof(u));
    const ncclResult_t r = ncclGetUniqueId(&u);
    id.assign(reinterpret_cast<const char*>(&u), sizeof(u));
    return r;
  }
  int commInitRank(Comm* comm, int size, const std::string& id, int rank) override {
    ncclUniqueId u;
    LOOM_CHECK_EQ(id.size(), sizeof(u), "ncclUniqueId bytes");
    std::memcpy(&u, id.data(), sizeof(u));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, size, u, rank, &config);
    *comm = c;
    return r;
  }
  int commGetAsyncError(Comm comm, int* state) override {
    ncclResult_t s = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(cm(comm), &s);
    *state = s;
    return r;
  }
  int commAbort(Comm comm) noexcept override { return ncclCommAbort(cm(comm)); }
  int commDestroy(Comm comm) noexcept override { return ncclCommDestroy(cm(comm)); }
  std::string errorString(int result) override {
    return ncclGetErrorString(static_cast<ncclResult_t>(result));
  }
  std::string lastError(Comm comm) override {
    const char* e = ncclGetLastError(cm(comm));
    return e != nullptr ? e : "";
  }
  int groupStart() override { return ncclGroupStart(); }
  int groupEnd() override { return ncclGroupEnd(); }
  int allReduce(const void* in, void* out, size_t count, NcclType type, NcclOp op, Comm comm,
                Stream stream) override {
    return ncclAllReduce(in, out, count, ty(type), rop(op), cm(comm), st(stream));
  }
  int broadcast(const void* in, void* out, size_t count, NcclType type, int root, Comm comm,
                Stream stream) override {
    return ncclBroadcast(in, out, count, ty(type), root, cm(comm), st(stream));
  }
  int reduce(const void* in, void* out, size_t count, NcclType type, NcclOp op, int root, Comm comm,
             Stream stream) override {
    return ncclReduce(in, out, count, ty(type), rop(op), root, cm(comm), st(stream));
  }
  int allGather(const void* in, void* out, size_t count, NcclType type, Comm comm,
                Stream stream) override {
    return ncclAllGather(in, out, count, ty(type), cm(comm), st(stream));
  }
  int reduceScatter(const void* in, void* out, size_t recvCount, NcclType type, NcclOp op,
                    Comm comm, Stream stream) override {
    return ncclReduceScatter(in, out, recvCount, ty(type), rop(op), cm(comm), st(stream));
  }
  int send(const void* buf, size_t count, NcclType type, int peer, Comm comm,
           Stream stream) override {
    return ncclSend(buf, count, ty(type), peer, cm(comm), st(stream));
  }
  int recv(void* buf, size_t count, NcclType type, int peer, Comm comm, Stream stream) override {
    return ncclRecv(buf, count, ty(type), peer, cm(comm), st(stream));
  }
};

}  // namespace

std::shared_ptr<NcclApi> cudaApi() {
  static const std::shared_ptr<NcclApi> api = std::make_shared<CudaNcclApi>();
  return api;
}

}  // namespace nccl_detail

int ncclDeviceCount() noexcept {
  try {
    return nccl_detail::cudaApi()->deviceCount();
  } catch (...) {
    return 0;
  }
}

std::string ncclNoDeviceReason() {
  try {
    return nccl_detail::cudaApi()->whyNoDevice();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::shared_ptr<ProcessGroup> createProcessGroupNccl(std::shared_ptr<Store> store, int rank,
                                                     int size, const ProcessGroupOptions& options) {
  return nccl_detail::createProcessGroupNcclOn(nccl_detail::cudaApi(), std::move(store), rank, size,
                                               options);
}

}  // namespace loom
