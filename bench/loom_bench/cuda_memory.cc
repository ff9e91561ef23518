#include "cuda_memory.h"

#include <cuda_runtime.h>

#include "loom/common/error.h"

namespace loom::bench {
namespace {

void cudaCheck(cudaError_t err, const char* what, size_t bytes) {
  if (err != cudaSuccess) {
    LOOM_THROW(IoError, what, " of ", bytes, " bytes failed: ", cudaGetErrorString(err));
  }
}

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {}

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice before cudaMalloc", bytes);
    cudaCheck(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc", bytes);
    return p;
  }
  void release(void* p) noexcept override { cudaFree(p); }
  // cudaMemcpy is synchronous with respect to the host for these directions; the default
  // stream also orders it after every collective the NCCL group enqueued before (the group's
  // stream waits on the legacy default stream, and Work::wait returned before this runs).
  void toDevice(void* dst, const void* src, size_t bytes) override {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device",
              bytes);
  }
  void toHost(void* dst, const void* src, size_t bytes) override {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host",
              bytes);
  }

 private:
  const int device_;
};

}  // namespace

int cudaDevices() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

std::string cudaDeviceName(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "unknown CUDA device";
  }
  return prop.name;
}

std::unique_ptr<DeviceMemory> makeCudaMemory(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    LOOM_THROW(NotAvailableError, "--backend nccl: no CUDA device is usable by this process (",
               err == cudaSuccess ? std::string("cudaGetDeviceCount found none")
                                  : std::string("cudaGetDeviceCount failed: ") +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err),
               ")");
  }
  if (device < 0 || device >= count) {
    LOOM_THROW(NotAvailableError, "--backend nccl: CUDA device ", device, " requested but ", count,
               " CUDA device(s) are visible");
  }
  cudaCheck(cudaSetDevice(device), "cudaSetDevice", 0);
  return std::make_unique<CudaMemory>(device);
}

}  // namespace loom::bench
