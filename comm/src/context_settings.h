// The one place comm reads the environment: the Context factories (Context::create,
// createVerbsContext, verbsAvailable) pass their ContextOptions through withEnvironment and
// validateOptions, then hand plain values to the transports, the arena and the engines.
#pragma once

#include "loom/comm/context.h"

namespace loom::comm {

// `options` with every comm variable of the settings registry applied by its precedence rule
// (loom/common/settings.h: a field left at its default takes the variable's value when it is
// set). Every variable is read, whether or not it matters here, so that a bad value always
// fails setup: InvalidArgumentError naming the variable, its value and what is accepted.
ContextOptions withEnvironment(ContextOptions options);

// Throws InvalidArgumentError naming the first field out of range ("ContextOptions::chunkBytes
// is 100; expected a byte count in [4096, 1073741824]").
void validateOptions(const ContextOptions& options);

}  // namespace loom::comm
