// ScopedEnv: sets (or unsets) one environment variable for a scope and restores its old value
// (or its absence) on exit. Only for the tests that check the environment parsing itself
// (every other test sets Options); header-only.
//
// Thread-safety: setenv/unsetenv must not race with getenv (a POSIX rule), so use it only while
// no other thread of the test runs Loom code, and before forking ranks.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace loom::testing {

class ScopedEnv {
 public:
  // `value` null unsets the variable.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
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
