// A group's setup failure, said once through its store: the ranks that wait on the rank that
// failed (or on ranks that wait on it) stop at once with an error of the same kind naming the
// cause, instead of each timing out later with a misleading cause of its own.
//
// - publishSetupFailure(store, key, error): puts "<kind>\n<message>" under `key` (kind: timeout,
//   invalid or io, from the error's type); the first failure wins (compareSet creates the key
//   only when absent), so a rank stopped by another's failure republishes nothing. Never throws:
//   the store may be what failed.
// - checkSetupFailure(store, key, who): when `key` holds a failure, throws an error of its kind
//   (TimeoutError, InvalidArgumentError, IoError): "<who>: another rank's setup failed: <message>".
// - waitWatchingSetup(store, keys, deadline, key, who): store.wait(keys) until `deadline`,
//   checking `key` every half second; the store's TimeoutError when the deadline passes.
// Blocking as said; thread-safe as the store is.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/store/store.h"

namespace loom {

void publishSetupFailure(Store& store, const std::string& key,
                         const std::exception& error) noexcept;
void checkSetupFailure(Store& store, const std::string& key, const std::string& who);
void waitWatchingSetup(Store& store, const std::vector<std::string>& keys, const Deadline& deadline,
                       const std::string& key, const std::string& who);

}  // namespace loom
