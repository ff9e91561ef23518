// ScopedEnv: sets (or, with a null value, unsets) one environment variable for the lifetime of
// the object and restores what was there before on destruction.
//
// Header-only. setenv and getenv must not race (POSIX): use it only while no other thread of
// the test reads the environment, e.g. around a group's creation, not while ranks run.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace loom::testing {

class ScopedEnv {
 public:
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
  const std::string name_;
  std::optional<std::string> old_;
};

}  // namespace loom::testing
