// What the transport tests (transport_test.cc, transport_errors_test.cc) share: the Context
// options of thread ranks on this host, and a substring expectation that prints the text.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "loom/comm/context.h"
#include "test_paths.h"

namespace loom::comm {

// testOptions (shared memory unless --tcp, test_paths.h) with a setup timeout.
inline ContextOptions localOptions(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ContextOptions o = testing::testOptions();
  o.timeout = timeout;
  return o;
}

inline void expectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

}  // namespace loom::comm
