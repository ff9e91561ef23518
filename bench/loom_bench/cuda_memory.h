// CUDA device memory for loom-bench --backend nccl: the sweep's DeviceMemory (runner.h) over
// cudaMalloc / cudaMemcpy on one device. Built with the CUDA runtime when Loom is built with
// NCCL (cuda_memory.cc); otherwise every entry point says so (cuda_memory_stub.cc).
#pragma once

#include <memory>
#include <string>

#include "loom/bench/runner.h"

namespace loom::bench {

// CUDA devices this process sees; 0 without a device, a driver, or CUDA in this build.
int cudaDevices() noexcept;

// "NVIDIA H100 80GB HBM3" for `device`.
std::string cudaDeviceName(int device);

// Memory on `device` (which becomes the calling thread's current device). Throws
// NotAvailableError when this build has no CUDA or `device` does not exist, IoError when a
// CUDA call fails (naming it and CUDA's message).
std::unique_ptr<DeviceMemory> makeCudaMemory(int device);

}  // namespace loom::bench
