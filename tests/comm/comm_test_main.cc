// main for the comm tests that ctest runs twice (tests/comm/CMakeLists.txt): gtest's flags,
// then --tcp to keep same-host ranks off shared memory (test_paths.h) or --generic-kernels to
// run the portable reduce kernels (setReduceIsa; the AVX2 ones where the CPU has them
// otherwise), or --single-copy=on|off to force the shared-memory single-copy path at every
// size or off, or --tcp-sockets=N for N connections per tcp peer pair, or --tcp-heal for
// healing same-host tcp connections (test_paths.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "loom/comm/reduce.h"
#include "test_paths.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--tcp") {
      loom::comm::testing::tcpOnly() = true;
    } else if (std::string_view(argv[i]) == "--generic-kernels") {
      loom::comm::setReduceIsa(loom::comm::ReduceIsa::kGeneric);
    } else if (std::string_view(argv[i]) == "--tcp-heal") {
      loom::comm::testing::tcpHeal() = true;
    } else if (std::string_view(argv[i]).rfind("--tcp-sockets=", 0) == 0) {
      loom::comm::testing::tcpSockets() = std::atoi(argv[i] + 14);
    } else if (std::string_view(argv[i]) == "--single-copy=on") {
      loom::comm::testing::singleCopyMode() = loom::comm::ShmSingleCopy::kOn;
    } else if (std::string_view(argv[i]) == "--single-copy=off") {
      loom::comm::testing::singleCopyMode() = loom::comm::ShmSingleCopy::kOff;
    } else {
      std::fprintf(stderr,
                   "unknown argument '%s'; expected gtest flags, --tcp, --generic-kernels, "
                   "--tcp-sockets=N, --tcp-heal or --single-copy=on|off\n",
                   argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
