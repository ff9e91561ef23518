// The process-wide trace behind loom/process_group/trace.h, as the process groups use it.
// Private to loom_process_group.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/process_group/trace.h"

namespace loom::trace {

// Opens the trace as rank `rank` writing under `dir` when none is open; returns true when this
// call opened it (the caller then calls close() when it goes). Throws InvalidArgumentError when
// `dir` is not a writable directory.
bool open(const std::string& dir, int rank);
// Writes the file and closes the trace.
void close();

}  // namespace loom::trace
