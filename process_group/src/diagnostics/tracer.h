// The process-wide trace behind loom/process_group/trace.h, as the process groups use it.
// Private to loom_process_group.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/process_group/trace.h"

namespace loom::trace {

// Takes a reference to the process's trace, opening it as rank `rank` under `dir` when none is
// open (a later group's dir and rank are those of the trace already open); returns true, and the
// caller calls close() once when it goes. Throws InvalidArgumentError when `dir` is not a
// writable directory.
bool open(const std::string& dir, int rank);
// Gives the reference back; the last one writes the file's end and closes it.
void close();

}  // namespace loom::trace
