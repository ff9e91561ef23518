// Which path the comm tests' same-host ranks take. ctest runs the sweeps, the transport tests
// and the process test twice: as built (shared memory between same-host ranks) and with --tcp
// (comm_test_main.cc), which makes every Context these tests create keep them on tcp through
// ContextOptions::sharedMemory. Binaries with gtest's own main always take the default path.
#pragma once

#include "loom/comm/context.h"

namespace loom::comm::testing {

// Set once by main before any test runs.
inline bool& tcpOnly() {
  static bool value = false;
  return value;
}

// --single-copy=on|off (comm_test_main.cc): the shared-memory single-copy path forced at
// every size or off; kAuto (the default) leaves the size crossover in charge.
inline ShmSingleCopy& singleCopyMode() {
  static ShmSingleCopy value = ShmSingleCopy::kAuto;
  return value;
}

// --tcp-sockets=N (comm_test_main.cc): connections per tcp peer pair; 0 leaves the default.
inline int& tcpSockets() {
  static int value = 0;
  return value;
}

// --tcp-heal (comm_test_main.cc): same-host tcp connections heal too (ContextOptions::
// tcpHealLocal), so that every send also goes through the replay ring (tcp_heal.cc).
inline bool& tcpHeal() {
  static bool value = false;
  return value;
}

// The Context options of these tests: loopback, and shared memory unless --tcp.
inline ContextOptions testOptions(ContextOptions base = {}) {
  base.host = "127.0.0.1";
  if (tcpOnly()) base.sharedMemory = false;
  if (tcpSockets() > 0) base.tcpSockets = tcpSockets();
  if (tcpHeal()) base.tcpHealLocal = true;
  if (base.shmSingleCopy == ShmSingleCopy::kAuto) base.shmSingleCopy = singleCopyMode();
  return base;
}

}  // namespace loom::comm::testing
