// ProcessGroupComm's private pieces shared by comm_backend.cc (running operations, failures) and
// comm_handoff.cc (how an operation reaches the thread that runs it): the hand-off's timing
// constants, and the failure-report exchange and the signature check of pg_failure.h, which
// the mpi backend shares.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "diagnostics/group_diagnostics.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "pg_failure.h"

namespace loom::comm_pg {

using namespace ::loom::pg_failure;  // FailureExchange, storeSlack, the store keys

// How often a waiting send / recv batch looks for more send / recv operations to start:
// every kP2PSliceMin at first, backing off to kP2PSliceMax while nothing changes.
constexpr milliseconds kP2PSliceMin{1};
constexpr milliseconds kP2PSliceMax{10};

// The hand-off (see comm_backend.h): for how long after the last inline run the worker keeps
// napping (options.comm.graceUs and napUs hold the grace and the nap).
inline constexpr milliseconds kHotWindow{5};

}  // namespace loom::comm_pg
