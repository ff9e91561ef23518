// The nccl backend's per-call stream (c10d's current stream). Free of CUDA headers: a stream is
// passed as the cudaStream_t's value.
//
// The nccl backend's Work follows c10d's ProcessGroupNCCL, not the host-blocking wait of
// loom/process_group/work.h: an operation is ordered after the work queued on the caller's
// stream when it is issued; Work::wait() makes the caller's stream wait for it and returns
// without blocking the host (it throws when the operation or the group already failed);
// Work::wait(timeout), and wait() with NcclOptions::blockingWait, block the host until it
// completed (in cudaEventSynchronize, as the CUDA context's scheduling flags say, bounded by the
// deadline through the watchdog);
// isCompleted() never blocks. Buffers stay valid until the Work completed. The full contract:
// process_group/src/nccl/nccl_backend.h.
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
