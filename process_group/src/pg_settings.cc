#include "pg_settings.h"

#include <optional>

#include "loom/common/logging.h"
#include "loom/common/settings.h"

namespace loom {

ProcessGroupOptions withEnvironment(ProcessGroupOptions options) {
  if (!options.debug) {
    if (const std::optional<std::string> v = settings::choice("LOOM_DEBUG")) {
      options.debug = parseDebugLevel(*v);
    }
  }
  const ProcessGroupOptions defaults;
  settings::fillDefault(options.flightRecorderEntries, defaults.flightRecorderEntries,
                        settings::integer("LOOM_FLIGHT_RECORDER_ENTRIES"));
  settings::fillDefault(options.flightRecorderPreciseEvery, defaults.flightRecorderPreciseEvery,
                        settings::integer("LOOM_FLIGHT_RECORDER_PRECISE_EVERY"));
  settings::fillDefault(options.dumpDir, defaults.dumpDir, settings::text("LOOM_DUMP_DIR"));
  settings::fillDefault(options.traceDir, defaults.traceDir, settings::text("LOOM_TRACE"));
  if (options.heartbeatInterval == defaults.heartbeatInterval) {
    if (const std::optional<long long> ms = settings::integer("LOOM_HEARTBEAT_MS")) {
      options.heartbeatInterval = std::chrono::milliseconds(*ms);
    }
  }
  const CommBackendOptions comm;
  settings::fillDefault(options.comm.graceUs, comm.graceUs, settings::integer("LOOM_PG_GRACE_US"));
  settings::fillDefault(options.comm.napUs, comm.napUs, settings::integer("LOOM_PG_NAP_US"));
  const NcclOptions nccl;
  settings::fillDefault(options.nccl.localRank, nccl.localRank, settings::integer("LOCAL_RANK"));
  if (const auto spin = settings::integer("LOOM_NCCL_WAIT_SPIN_US");
      spin && options.nccl.hostSpin == nccl.hostSpin) {
    options.nccl.hostSpin = std::chrono::microseconds(*spin);
  }
  return options;
}

InitOptions withEnvironment(InitOptions options) {
  const InitOptions defaults;
  settings::fillDefault(options.initMethod, defaults.initMethod,
                        settings::text("LOOM_INIT_METHOD"));
  settings::fillDefault(options.pg.comm.context.host, defaults.pg.comm.context.host,
                        settings::text("LOOM_HOST"));
  options.pg = withEnvironment(std::move(options.pg));
  return options;
}

Environment launchEnvironment() {
  return settings::snapshot(settings::Section::kLaunch);
}

namespace {

// What comm says about its own options that differ from their defaults; comm has no such
// description yet, so the line lists the process group's options only.
// The Context's own non-default fields, named as fields of ProcessGroupOptions.
std::string describeContext(const comm::ContextOptions& o) {
  std::string out;
  std::string all = comm::describeNonDefault(o);
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find(' ', start);
    if (end == std::string::npos) end = all.size();
    out += (out.empty() ? "comm.context." : " comm.context.") + all.substr(start, end - start);
    start = end + 1;
  }
  return out;
}

void append(std::string& out, const std::string& item) {
  if (!item.empty()) out += (out.empty() ? "" : " ") + item;
}

template <class T>
void appendIfChanged(std::string& out, const char* name, const T& value, const T& dflt,
                     const std::string& text) {
  if (!(value == dflt)) append(out, detail::str(name, "=", text));
}

}  // namespace

std::string describeNonDefault(const ProcessGroupOptions& o) {
  const ProcessGroupOptions d;
  std::string out;
  appendIfChanged(out, "timeout", o.timeout, d.timeout, detail::str(o.timeout.count(), "ms"));
  if (o.debug) append(out, detail::str("debug=", debugLevelName(*o.debug)));
  appendIfChanged(out, "groupName", o.groupName, d.groupName, o.groupName);
  std::string ranks;
  for (int r : o.parentRanks) ranks += detail::str(ranks.empty() ? "" : ",", r);
  appendIfChanged(out, "parentRanks", o.parentRanks, d.parentRanks, ranks);
  appendIfChanged(out, "failureReportWindow", o.failureReportWindow, d.failureReportWindow,
                  detail::str(o.failureReportWindow.count(), "ms"));
  appendIfChanged(out, "flightRecorderEntries", o.flightRecorderEntries, d.flightRecorderEntries,
                  std::to_string(o.flightRecorderEntries));
  appendIfChanged(out, "flightRecorderPreciseEvery", o.flightRecorderPreciseEvery,
                  d.flightRecorderPreciseEvery, std::to_string(o.flightRecorderPreciseEvery));
  appendIfChanged(out, "dumpDir", o.dumpDir, d.dumpDir, o.dumpDir);
  appendIfChanged(out, "heartbeatInterval", o.heartbeatInterval, d.heartbeatInterval,
                  detail::str(o.heartbeatInterval.count(), "ms"));
  appendIfChanged(out, "traceDir", o.traceDir, d.traceDir, o.traceDir);
  appendIfChanged(out, "storeHostRank", o.storeHostRank, d.storeHostRank,
                  std::to_string(o.storeHostRank));
  appendIfChanged(out, "comm.graceUs", o.comm.graceUs, d.comm.graceUs,
                  std::to_string(o.comm.graceUs));
  appendIfChanged(out, "comm.napUs", o.comm.napUs, d.comm.napUs, std::to_string(o.comm.napUs));
  append(out, describeContext(o.comm.context));
  appendIfChanged(out, "nccl.device", o.nccl.device, d.nccl.device, std::to_string(o.nccl.device));
  appendIfChanged(out, "nccl.localRank", o.nccl.localRank, d.nccl.localRank,
                  std::to_string(o.nccl.localRank));
  appendIfChanged(out, "nccl.stream", o.nccl.stream, d.nccl.stream, detail::str(o.nccl.stream));
  appendIfChanged(out, "nccl.perThreadDefaultStream", o.nccl.perThreadDefaultStream,
                  d.nccl.perThreadDefaultStream, "true");
  appendIfChanged(out, "nccl.blockingWait", o.nccl.blockingWait, d.nccl.blockingWait, "true");
  appendIfChanged(out, "nccl.hostSpin", o.nccl.hostSpin, d.nccl.hostSpin,
                  detail::str(o.nccl.hostSpin.count(), "us"));
  appendIfChanged(out, "nccl.p2pBatchWindow", o.nccl.p2pBatchWindow, d.nccl.p2pBatchWindow,
                  detail::str(o.nccl.p2pBatchWindow.count(), "ms"));
  return out;
}

void logGroupReady(const ProcessGroup& pg) {
  // LOOM_DEBUG=INFO asks for group setup logs whatever the log level.
  if (!logEnabled(LogLevel::kInfo) && pg.debugLevel() == DebugLevel::kOff) return;
  const std::string set = settings::describeSet();
  const std::string changed = describeNonDefault(pg.options());
  const std::string tuning = pg.tuningSummary();
  logMessage(LogLevel::kInfo,
             detail::str(pg.who(), ": ", pg.backendName(), " process group of size ", pg.size(),
                         " ready over ", pg.transportSummary(), tuning.empty() ? "" : "; tuning: ",
                         tuning, "; environment: ", set.empty() ? "(none set)" : set,
                         "; options: ", changed.empty() ? "(defaults)" : changed));
}

}  // namespace loom
