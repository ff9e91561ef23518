// The nccl backend's point-to-point batch (nccl_backend.h, "Point-to-point"): consecutive send /
// recv operations wait in NcclState::batch and are issued as one NCCL group (ncclGroupStart /
// ncclGroupEnd) when the batch ends: at the next other operation, the end of batchSendRecv, a
// wait or poll of one of its Works, the group's destruction, or the watchdog's timer
// options.nccl.p2pBatchWindow after its first operation.
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "loom/common/error.h"
#include "nccl/nccl_state.h"

namespace loom::nccl_detail {

void NcclState::flushLocked() {
  if (batch.empty()) return;
  std::vector<PendingP2P> ops;
  ops.swap(batch);
  ++batches;
  // The earliest deadline of the batch bounds its enqueue.
  std::chrono::milliseconds timeout = ops.front().op->timeout;
  for (const auto& p : ops) timeout = std::min(timeout, p.op->timeout);
  const Deadline deadline(timeout);
  const std::string what = ops.size() == 1 ? ops.front().op->describe()
                                           : "a batch of " + std::to_string(ops.size()) +
                                                 " send/recv from " + ops.front().op->describe();
  try {
    if (broken)
      throw IoError(who + ": " + what + " was not run: the group failed earlier: " + cause);
    int r = api->groupStart();
    if (r != kNcclSuccess) checkResult(r, what + " (ncclGroupStart)", deadline);
    for (const auto& p : ops) {
      const OpDesc& op = *p.op;
      if (op.type == OpType::kSend) {
        r = api->send(op.in.data, op.count, ncclTypeOf(op.dtype), op.root, comm, stream);
      } else {
        r = api->recv(op.out.data, op.count, ncclTypeOf(op.dtype), op.root, comm, stream);
      }
      if (r != kNcclSuccess && r != kNcclInProgress) {
        api->groupEnd();
        checkResult(r, op.describe(), deadline);
      }
    }
    checkResult(api->groupEnd(), what, deadline);
    EventHandle done = events.acquire();
    api->recordEvent(done.get(), stream);
    auto dog = watchdog.lock();
    for (const auto& p : ops) {
      p.work->setIssued(done);
      if (dog) {
        dog->track(done, p.op->recordId,
                   p.op->describe() + " (" + std::to_string(p.op->count * dtypeSize(p.op->dtype)) +
                       " bytes)",
                   p.op->timeout, p.op);
      }
    }
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    for (const auto& p : ops) {
      if (recorder != nullptr) recorder->recordEnd(p.op->recordId, true);
      p.work->markFailed(error);
    }
  }
}

void NcclState::flush() {
  std::lock_guard<std::mutex> lock(mu);
  if (batch.empty()) return;
  DeviceGuard guard(*api, device);
  flushLocked();
}

void armBatchTimer(Watchdog& watchdog, const std::shared_ptr<NcclState>& state) {
  const uint64_t open = state->batches;
  std::weak_ptr<NcclState> weak = state;
  watchdog.setTimer(Clock::now() + state->options.p2pBatchWindow, [weak, open] {
    auto state = weak.lock();
    if (!state) return;
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->batches != open || state->batch.empty()) return;
    DeviceGuard guard(*state->api, state->device);
    state->flushLocked();
  });
}

}  // namespace loom::nccl_detail
