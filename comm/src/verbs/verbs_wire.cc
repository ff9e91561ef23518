// The pure parts of the verbs transport: queue-pair info text form, the VerbsOptions settings,
// device / port / gid-index checks.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "loom/common/error.h"
#include "verbs/verbs_ops.h"

namespace loom::comm::verbs {

bool gidIsZero(const uint8_t (&gid)[16]) {
  for (uint8_t b : gid) {
    if (b != 0) return false;
  }
  return true;
}

std::string serializeQpInfo(const QpInfo& info) {
  char gid[33];
  for (int i = 0; i < 16; ++i) std::snprintf(gid + 2 * i, 3, "%02x", info.gid[i]);
  return detail::str("v2 ", info.lid, " ", gid, " ", info.qpn, " ", info.psn, " ", info.mtu, " ",
                     info.rkey, " ", info.addr, " ", info.slots, " ", info.slotBytes);
}

namespace {

uint64_t parseField(std::istringstream& in, const char* field, uint64_t max,
                    const std::string& what, const std::string& text) {
  std::string tok;
  if (!(in >> tok)) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, " is truncated: field '", field,
               "' missing in \"", text, "\"");
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(tok.c_str(), &end, 10);
  if (tok.empty() || *end != '\0' || errno != 0 || tok[0] == '-' || v > max) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, ": field '", field, "' is \"", tok,
               "\", expected an integer in [0, ", max, "]");
  }
  return v;
}

}  // namespace

QpInfo parseQpInfo(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  std::string version;
  in >> version;
  if (version != "v2") {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, " has version \"", version,
               "\", expected \"v2\" (ranks run different Loom builds?)");
  }
  QpInfo info;
  info.lid = static_cast<uint16_t>(parseField(in, "lid", 0xffff, what, text));
  std::string gid;
  in >> gid;
  if (gid.size() != 32 || gid.find_first_not_of("0123456789abcdef") != std::string::npos) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, ": field 'gid' is \"", gid,
               "\", expected 32 lowercase hex digits");
  }
  for (int i = 0; i < 16; ++i) {
    info.gid[i] = static_cast<uint8_t>(std::strtoul(gid.substr(2 * i, 2).c_str(), nullptr, 16));
  }
  info.qpn = static_cast<uint32_t>(parseField(in, "qpn", 0xffffff, what, text));
  info.psn = static_cast<uint32_t>(parseField(in, "psn", 0xffffff, what, text));
  info.mtu = static_cast<uint32_t>(parseField(in, "mtu", 5, what, text));
  if (info.mtu == 0) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what,
               ": field 'mtu' is 0, expected an ibv_mtu value in [1, 5]");
  }
  info.rkey = static_cast<uint32_t>(parseField(in, "rkey", 0xffffffffu, what, text));
  info.addr = parseField(in, "addr", UINT64_MAX, what, text);
  info.slots = static_cast<uint32_t>(parseField(in, "slots", 1u << 16, what, text));
  info.slotBytes = static_cast<uint32_t>(parseField(in, "slotBytes", 1u << 30, what, text));
  if (info.slots == 0 || info.slotBytes <= sizeof(SlotHeader)) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, ": ring of ", info.slots,
               " slots of ", info.slotBytes, " bytes, expected at least 1 slot of more than ",
               sizeof(SlotHeader), " bytes");
  }
  std::string extra;
  if (in >> extra) {
    LOOM_THROW(InvalidArgumentError, "queue-pair info ", what, " has trailing text \"", extra,
               "\"");
  }
  return info;
}

VerbsConfig verbsConfigFrom(const VerbsOptions& options) {
  VerbsConfig c;
  c.device = options.device;
  c.port = options.port;
  c.gidIndex = options.gidIndex;
  c.slots = static_cast<uint32_t>(options.slots);
  c.slotBytes = static_cast<uint32_t>(options.slotBytes);
  return c;
}

size_t selectDevice(const std::vector<std::string>& names, const std::string& requested) {
  if (names.empty()) {
    LOOM_THROW(NotAvailableError, "no RDMA device found (ibv_get_device_list returned 0 devices)");
  }
  if (requested.empty()) return 0;
  std::string found;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == requested) return i;
    found += (found.empty() ? "" : ", ") + names[i];
  }
  LOOM_THROW(InvalidArgumentError, "LOOM_IB_DEVICE=\"", requested,
             "\" names no RDMA device; devices found: ", found);
}

void checkPortAndGid(const std::string& device, int port, int numPorts, int gidIndex,
                     int gidTableLen) {
  if (port < 1 || port > numPorts) {
    LOOM_THROW(InvalidArgumentError, "LOOM_IB_PORT=", port, " is not a port of ", device,
               ": expected 1..", numPorts);
  }
  if (gidIndex < 0 || gidIndex >= gidTableLen) {
    LOOM_THROW(InvalidArgumentError, "LOOM_IB_GID_INDEX=", gidIndex, " is out of range for ",
               device, " port ", port, ": its GID table has ", gidTableLen,
               " entries (expected 0..", gidTableLen - 1, ")");
  }
}

}  // namespace loom::comm::verbs
