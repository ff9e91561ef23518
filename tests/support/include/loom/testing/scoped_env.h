// ScopedEnv: sets (or unsets) one environment variable for the scope of the object and restores
// what was there. Only for tests of the environment parsing itself (the settings registry and
// the entry points that read it); every other test sets Options. The variable must be declared
// in the settings registry (common/src/settings_table.cc). Not thread-safe: set it while no
// other thread reads the environment (no group, no Context alive).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "loom/common/settings.h"

namespace loom::testing {

class ScopedEnv {
 public:
  // `value` nullptr unsets the variable.
  ScopedEnv(const char* name, const char* value) : name_(name), old_(settings::value(name)) {
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace loom::testing
