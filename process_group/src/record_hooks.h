// ProcessGroup's flight recorder hooks (process_group.h declares them inline), for the
// backends' source files: the recorder's stores land in the thread that runs the operation
// without a call.
#pragma once

#include "diagnostics/flight_recorder.h"
#include "loom/process_group/process_group.h"

namespace loom {

inline void ProcessGroup::recordStart(const OpDesc& op) {
  if (recorder_ != nullptr) recorder_->recordStart(op);
  if (traceLane_ >= 0) traceStart(op);
}

inline void ProcessGroup::recordEnd(const OpDesc& op, bool failed, int peer) {
  if (recorder_ != nullptr) recorder_->recordEnd(op, failed, peer);
  if (traceLane_ >= 0) traceEnd(op, failed);
}

}  // namespace loom
