// What the diagnostics tests share (diagnostics_test.cc, group_diagnostics_test.cc).
#pragma once

#include <unistd.h>

#include <cstdint>

#include "diagnostics/group_diagnostics.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"

namespace loom::diag {

// A heartbeat of process `pid` on this host and in this pid namespace, beating every second.
inline Heartbeat localHeartbeat(int64_t pid, int64_t timeUs) {
  Heartbeat hb;
  hb.timeUs = timeUs;
  hb.pid = pid;
  hb.beat = 1;
  hb.intervalMs = 1000;
  hb.host = net::hostname();
  char ns[128] = {};
  LOOM_CHECK(::readlink("/proc/self/ns/pid", ns, sizeof ns - 1) > 0, "no /proc/self/ns/pid");
  hb.pidNs = ns;
  return hb;
}

}  // namespace loom::diag
