// messageOf<E>(fn): runs fn and returns the message of the E it throws; a test failure (and "")
// when it throws nothing. Anything other than an E propagates and fails the test with its own
// message.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace loom::testing {

template <typename E, typename F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type was thrown";
  return {};
}

}  // namespace loom::testing
