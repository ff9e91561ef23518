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
// A lane (Chrome "tid") of its own, named `name` (a process group's collectives).
int lane(const std::string& name);
// A complete event on `lane`.
void completeOn(int lane, std::string_view name, std::string_view category, int64_t startUs,
                int64_t endUs, std::string_view argsJson);

}  // namespace loom::trace
