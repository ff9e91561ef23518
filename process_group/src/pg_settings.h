// process_group's side of the settings registry (loom/common/settings.h): the one file of
// process_group/ that reads the environment. The entry points (createProcessGroup,
// initProcessGroup) pass their options through withEnvironment; the backends below them read
// options only.
//
// Precedence, as everywhere: a field the caller left at its default takes the variable's value
// when the variable is set; a field the caller changed keeps the caller's value. A variable set
// to a bad value is an InvalidArgumentError naming it, thrown before anything is created.
#pragma once

#include <string>

#include "loom/process_group/init.h"
#include "loom/process_group/process_group.h"

namespace loom {

// LOOM_DEBUG -> debug, LOOM_FLIGHT_RECORDER_ENTRIES -> flightRecorderEntries, LOOM_DUMP_DIR ->
// dumpDir, LOOM_PG_GRACE_US -> comm.graceUs, LOOM_PG_NAP_US -> comm.napUs, LOCAL_RANK ->
// nccl.localRank.
ProcessGroupOptions withEnvironment(ProcessGroupOptions options);
// The above for options.pg, and LOOM_INIT_METHOD -> initMethod, LOOM_HOST ->
// pg.comm.context.host (initProcessGroup picks a host when neither sets one).
InitOptions withEnvironment(InitOptions options);

// "timeout=10000ms comm.napUs=0": the options that differ from their defaults, for logs.
std::string describeNonDefault(const ProcessGroupOptions& options);

// The line every group created by createProcessGroup logs at level info: who, what carries its
// data, the LOOM_* variables that are set and the options that differ from their defaults.
void logGroupReady(const ProcessGroup& pg);

}  // namespace loom
