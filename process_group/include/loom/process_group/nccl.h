// The nccl backend's per-call stream (c10d's current stream). Free of CUDA headers: a stream is
// passed as the cudaStream_t's value.
//
// Contract
// - While an NcclStreamGuard lives, the operations its thread issues on any nccl group are
//   ordered after the work queued on `stream` at issue time, and Work::wait() (on that thread)
//   makes `stream` wait for the operation. Without a guard, a group uses
//   NcclOptions::stream, else the thread's default stream (NcclOptions::perThreadDefaultStream).
// - Guards nest (the innermost wins) and are per thread; destroy them in reverse order.
// - Other backends ignore it. Cheap: one thread-local store each way.
#pragma once

namespace loom {

class NcclStreamGuard {
 public:
  explicit NcclStreamGuard(void* cudaStream);
  ~NcclStreamGuard();
  NcclStreamGuard(const NcclStreamGuard&) = delete;
  NcclStreamGuard& operator=(const NcclStreamGuard&) = delete;

  // The innermost guard's stream on this thread; nullptr when none.
  static void* current();

 private:
  void* previous_;
  bool previousSet_;
};

}  // namespace loom
