// withEnvironment, validateOptions and describeNonDefault: the comm rows of the settings
// registry (common/src/settings_table.cc) applied to ContextOptions, in one function.
#include "context_settings.h"

#include <sstream>

#include "loom/common/error.h"
#include "loom/common/interfaces.h"
#include "loom/common/schedule_noise.h"
#include "loom/common/settings.h"

namespace loom::comm {

namespace {

constexpr long long kGiB = 1LL << 30;
constexpr long long kMaxMicros = 10'000'000;

void checkRange(const char* field, long long value, long long lo, long long hi, const char* unit) {
  LOOM_CHECK(value >= lo && value <= hi, "ContextOptions::", field, " is ", value, "; expected ",
             unit, " in [", lo, ", ", hi, "]");
}

// 0 means "the default" for these; anything else must be in range.
void checkOptionalBytes(const char* field, size_t value) {
  if (value != 0) checkRange(field, static_cast<long long>(value), 4096, kGiB, "a byte count");
}

}  // namespace

ContextOptions withEnvironment(ContextOptions o) {
  namespace s = settings;
  const ContextOptions d;
  if (const auto name = s::choice("LOOM_ALGO")) {
    // "shm" keeps the automatic choice, the arena included.
    const Algorithm a = *name == "shm" ? Algorithm::kAuto : parseAlgorithm(*name);
    s::fillDefault(o.algorithm, d.algorithm, std::optional<Algorithm>(a));
  }
  s::fillDefault(o.chunkBytes, d.chunkBytes, s::bytes("LOOM_CHUNK_BYTES"));
  if (const auto isa = s::choice("LOOM_REDUCE_ISA")) {
    const ReduceIsa v = *isa == "generic" ? ReduceIsa::kGeneric : ReduceIsa::kAuto;
    s::fillDefault(o.reduceIsa, d.reduceIsa, std::optional<ReduceIsa>(v));
  }
  s::fillDefault(o.host, d.host, s::text("LOOM_HOST"));
  if (o.host.empty()) o.host = net::defaultListenAddress("");  // LOOM_SOCKET_IFNAME's choice
  s::fillDefault(o.busyPollUs, d.busyPollUs, s::integer("LOOM_TCP_BUSY_US"));
  s::fillDefault(o.tcpSendBytes, d.tcpSendBytes, s::bytes("LOOM_TCP_SEND_BYTES"));
  // "auto" is the kernel's autotuning, which the option spells as a negative size.
  if (s::word("LOOM_TCP_BUFFER_BYTES")) {
    s::fillDefault(o.socketBufferBytes, d.socketBufferBytes, std::optional<int>(-1));
  }
  s::fillDefault(o.socketBufferBytes, d.socketBufferBytes, s::bytes("LOOM_TCP_BUFFER_BYTES"));
  s::fillDefault(o.tcpSpinUs, d.tcpSpinUs, s::integer("LOOM_SPIN_US"));
  s::fillDefault(o.tcpSockets, d.tcpSockets, s::integer("LOOM_TCP_SOCKETS"));
  s::fillDefault(o.tcpReconnectMs, d.tcpReconnectMs, s::integer("LOOM_TCP_RECONNECT_MS"));
  s::fillDefault(o.tcpHealLocal, d.tcpHealLocal, s::flag("LOOM_TCP_HEAL_LOCAL"));
  s::fillDefault(o.sharedMemory, d.sharedMemory, s::flag("LOOM_SHM"));
  s::fillDefault(o.shmPointToPoint, d.shmPointToPoint, s::flag("LOOM_SHM_P2P"));
  s::fillDefault(o.shmHostId, d.shmHostId, s::text("LOOM_SHM_HOST_ID"));
  s::fillDefault(o.shmMemfd, d.shmMemfd, s::flag("LOOM_SHM_MEMFD"));
  s::fillDefault(o.shmSlotBytes, d.shmSlotBytes, s::bytes("LOOM_SHM_SLOT_BYTES"));
  s::fillDefault(o.shmRingBytes, d.shmRingBytes, s::bytes("LOOM_SHM_RING_BYTES"));
  s::fillDefault(o.shmSpinUs, d.shmSpinUs, s::integer("LOOM_SHM_SPIN_US"));
  s::fillDefault(o.shmYieldUs, d.shmYieldUs, s::integer("LOOM_SHM_YIELD_US"));
  s::fillDefault(o.shmFoldSkew, d.shmFoldSkew, s::flag("LOOM_SHM_FOLD_SKEW"));
  // "auto" is spelled -1 in the option.
  if (s::word("LOOM_SHM_COPY_THREADS")) {
    s::fillDefault(o.shmCopyThreads, d.shmCopyThreads, std::optional<int>(-1));
  }
  s::fillDefault(o.shmCopyThreads, d.shmCopyThreads, s::integer("LOOM_SHM_COPY_THREADS"));
  if (const auto mode = s::choice("LOOM_SHM_SINGLE_COPY")) {
    const ShmSingleCopy v = *mode == "on"    ? ShmSingleCopy::kOn
                            : *mode == "off" ? ShmSingleCopy::kOff
                                             : ShmSingleCopy::kAuto;
    s::fillDefault(o.shmSingleCopy, d.shmSingleCopy, std::optional<ShmSingleCopy>(v));
  }
  s::fillDefault(o.shmWindows, d.shmWindows, s::flag("LOOM_SHM_WINDOWS"));
  s::fillDefault(o.shmWindowMinBytes, d.shmWindowMinBytes, s::bytes("LOOM_SHM_WINDOW_MIN_BYTES"));
  s::fillDefault(o.tuningFile, d.tuningFile, s::text("LOOM_TUNING_FILE"));
  s::fillDefault(o.reproducible, d.reproducible, s::flag("LOOM_REPRODUCIBLE"));
  s::fillDefault(o.tuningCache, d.tuningCache, s::text("LOOM_TUNING_CACHE"));
  s::fillDefault(o.verbs.device, d.verbs.device, s::text("LOOM_IB_DEVICE"));
  s::fillDefault(o.verbs.port, d.verbs.port, s::integer("LOOM_IB_PORT"));
  s::fillDefault(o.verbs.gidIndex, d.verbs.gidIndex, s::integer("LOOM_IB_GID_INDEX"));
  s::fillDefault(o.verbs.slots, d.verbs.slots, s::integer("LOOM_IB_SLOTS"));
  s::fillDefault(o.verbs.slotBytes, d.verbs.slotBytes, s::bytes("LOOM_IB_SLOT_BYTES"));
  // Process-wide and test-only (loom/common/schedule_noise.h): read at every Context setup, as
  // LOOM_REDUCE_ISA is, so that a bad value fails the setup and not a collective.
  scheduleNoiseUs.store(s::integer("LOOM_SCHEDULE_NOISE_US").value_or(0),
                        std::memory_order_relaxed);
  return o;
}

void validateOptions(const ContextOptions& o) {
  LOOM_CHECK(o.timeout.count() > 0, "ContextOptions::timeout is ", o.timeout.count(),
             " ms; expected a positive duration");
  checkRange("socketBufferBytes", o.socketBufferBytes, -1LL << 31, kGiB, "a byte count");
  checkRange("busyPollUs", o.busyPollUs, -1LL << 31, kMaxMicros, "µs (< 0: the default)");
  (void)algorithmName(o.algorithm);
  checkRange("chunkBytes", static_cast<long long>(o.chunkBytes), 4096, kGiB, "a byte count");
  LOOM_CHECK(o.reduceIsa == ReduceIsa::kAuto || o.reduceIsa == ReduceIsa::kGeneric,
             "ContextOptions::reduceIsa is ", static_cast<int>(o.reduceIsa),
             "; expected kAuto or kGeneric");
  checkRange("tcpSendBytes", static_cast<long long>(o.tcpSendBytes), 4096, kGiB, "a byte count");
  checkRange("tcpSpinUs", o.tcpSpinUs, 0, kMaxMicros, "µs");
  checkRange("tcpSockets", o.tcpSockets, 1, 16, "connections per peer");
  checkRange("tcpReconnectMs", o.tcpReconnectMs, 0, 3'600'000, "ms");
  checkOptionalBytes("shmSlotBytes", o.shmSlotBytes);
  checkOptionalBytes("shmRingBytes", o.shmRingBytes);
  checkRange("shmSpinUs", o.shmSpinUs, -1LL << 31, kMaxMicros, "µs (< 0: the default)");
  checkRange("shmYieldUs", o.shmYieldUs, -1LL << 31, kMaxMicros, "µs (< 0: the default)");
  checkRange("shmCopyThreads", o.shmCopyThreads, -1, 64, "helper threads per rank (-1: auto)");
  LOOM_CHECK(o.shmSingleCopy == ShmSingleCopy::kAuto || o.shmSingleCopy == ShmSingleCopy::kOn ||
                 o.shmSingleCopy == ShmSingleCopy::kOff,
             "ContextOptions::shmSingleCopy is ", static_cast<int>(o.shmSingleCopy),
             "; expected kAuto, kOn or kOff");
  checkRange("verbs.port", o.verbs.port, 1, 255, "a port");
  checkRange("verbs.gidIndex", o.verbs.gidIndex, 0, 65535, "an index");
  checkRange("verbs.slots", o.verbs.slots, 2, 4096, "a slot count");
  checkRange("verbs.slotBytes", static_cast<long long>(o.verbs.slotBytes), 256, 64LL << 20,
             "a byte count");
}

std::string describeNonDefault(const ContextOptions& o) {
  const ContextOptions d;
  std::ostringstream out;
  auto put = [&](const char* name, const auto& value, const auto& def) {
    if (value == def) return;
    if (out.tellp() > 0) out << ' ';
    out << name << '=' << value;
  };
  put("timeout", o.timeout.count(), d.timeout.count());
  put("host", o.host, d.host);
  put("sharedMemory", int{o.sharedMemory}, int{d.sharedMemory});
  put("storePrefix", o.storePrefix, d.storePrefix);
  put("socketBufferBytes", o.socketBufferBytes, d.socketBufferBytes);
  put("busyPollUs", o.busyPollUs, d.busyPollUs);
  put("algorithm", std::string(algorithmName(o.algorithm)),
      std::string(algorithmName(d.algorithm)));
  put("chunkBytes", o.chunkBytes, d.chunkBytes);
  put("reduceIsa", std::string(o.reduceIsa == ReduceIsa::kGeneric ? "generic" : "auto"),
      std::string("auto"));
  put("tcpSendBytes", o.tcpSendBytes, d.tcpSendBytes);
  put("tcpSpinUs", o.tcpSpinUs, d.tcpSpinUs);
  put("tcpSockets", o.tcpSockets, d.tcpSockets);
  put("tcpReconnectMs", o.tcpReconnectMs, d.tcpReconnectMs);
  put("tcpHealLocal", int{o.tcpHealLocal}, int{d.tcpHealLocal});
  put("shmPointToPoint", int{o.shmPointToPoint}, int{d.shmPointToPoint});
  put("shmHostId", o.shmHostId, d.shmHostId);
  put("shmMemfd", int{o.shmMemfd}, int{d.shmMemfd});
  put("shmSlotBytes", o.shmSlotBytes, d.shmSlotBytes);
  put("shmRingBytes", o.shmRingBytes, d.shmRingBytes);
  put("shmSpinUs", o.shmSpinUs, d.shmSpinUs);
  put("shmYieldUs", o.shmYieldUs, d.shmYieldUs);
  put("shmFoldSkew", int{o.shmFoldSkew}, int{d.shmFoldSkew});
  put("shmCopyThreads", o.shmCopyThreads, d.shmCopyThreads);
  const char* const singleCopyNames[] = {"auto", "on", "off"};
  put("shmSingleCopy", std::string(singleCopyNames[static_cast<int>(o.shmSingleCopy) % 3]),
      std::string("auto"));
  put("shmWindows", int{o.shmWindows}, int{d.shmWindows});
  put("shmWindowMinBytes", o.shmWindowMinBytes, d.shmWindowMinBytes);
  put("tuningFile", o.tuningFile, d.tuningFile);
  put("reproducible", int{o.reproducible}, int{d.reproducible});
  put("tuningCache", o.tuningCache, d.tuningCache);
  put("verbs.device", o.verbs.device, d.verbs.device);
  put("verbs.port", o.verbs.port, d.verbs.port);
  put("verbs.gidIndex", o.verbs.gidIndex, d.verbs.gidIndex);
  put("verbs.slots", o.verbs.slots, d.verbs.slots);
  put("verbs.slotBytes", o.verbs.slotBytes, d.verbs.slotBytes);
  return out.str();
}

}  // namespace loom::comm
