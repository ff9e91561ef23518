// loom-bench built without CUDA (Loom configured without NCCL): no device memory.
#include "cuda_memory.h"

#include "loom/common/error.h"

namespace loom::bench {

int cudaDevices() noexcept {
  return 0;
}

std::string cudaDeviceName(int) {
  return "none";
}

std::unique_ptr<DeviceMemory> makeCudaMemory(int) {
  LOOM_THROW(NotAvailableError,
             "--backend nccl: loom-bench was built without CUDA (Loom was configured without NCCL, "
             "LOOM_WITH_NCCL=OFF or CUDA/NCCL not found)");
}

}  // namespace loom::bench
