#include "wire.h"

#include <bit>
#include <cstring>

#include "loom/common/error.h"
#include "loom/common/socket.h"

namespace loom::rpc::wire {

static_assert(std::endian::native == std::endian::little,
              "the RPC wire format is little-endian; a big-endian port must swap the header");

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::kHello:
      return "hello";
    case Kind::kRequest:
      return "request";
    case Kind::kRemote:
      return "remote";
    case Kind::kFetch:
      return "fetch";
    case Kind::kDelete:
      return "delete";
    case Kind::kResult:
      return "result";
    case Kind::kError:
      return "error";
  }
  return "unknown";
}

void writeFrame(int fd, Kind kind, uint64_t id, uint64_t aux, uint32_t timeoutMs,
                const std::string& name, const std::vector<uint8_t>& payload,
                const Deadline& deadline, const std::string& what) {
  LOOM_CHECK(name.size() <= kMaxNameBytes, "RPC function name of ", name.size(), " bytes; at most ",
             kMaxNameBytes, " allowed");
  Header h;
  h.kind = static_cast<uint8_t>(kind);
  h.timeoutMs = timeoutMs;
  h.nameBytes = static_cast<uint32_t>(name.size());
  h.id = id;
  h.aux = aux;
  h.payloadBytes = payload.size();
  std::vector<uint8_t> buf(sizeof(h) + name.size() + payload.size());
  std::memcpy(buf.data(), &h, sizeof(h));
  if (!name.empty()) std::memcpy(buf.data() + sizeof(h), name.data(), name.size());
  if (!payload.empty()) {
    std::memcpy(buf.data() + sizeof(h) + name.size(), payload.data(), payload.size());
  }
  net::writeFull(fd, buf.data(), buf.size(), deadline, what);
}

Frame readFrame(int fd, size_t maxBytes, const Deadline& deadline, const std::string& what) {
  Frame f;
  net::readFull(fd, &f.header, sizeof(f.header), deadline, what);
  const Header& h = f.header;
  if (h.magic != kMagic || h.version != kVersion) {
    LOOM_THROW(IoError, "bad RPC frame from ", what, ": magic 0x", std::hex, h.magic, " version ",
               std::dec, int(h.version), ", expected magic 0x", std::hex, kMagic, " version ",
               std::dec, int(kVersion), " (not a Loom RPC peer?)");
  }
  if (h.kind < static_cast<uint8_t>(Kind::kHello) || h.kind > static_cast<uint8_t>(Kind::kError)) {
    LOOM_THROW(IoError, "bad RPC frame from ", what, ": unknown kind ", int(h.kind));
  }
  if (h.nameBytes > kMaxNameBytes || h.payloadBytes > maxBytes) {
    LOOM_THROW(IoError, "RPC frame from ", what, " too large: name ", h.nameBytes, " bytes (max ",
               kMaxNameBytes, "), payload ", h.payloadBytes, " bytes (max ", maxBytes, ")");
  }
  f.name.resize(h.nameBytes);
  if (h.nameBytes > 0) net::readFull(fd, f.name.data(), h.nameBytes, deadline, what);
  f.payload.resize(h.payloadBytes);
  if (h.payloadBytes > 0) net::readFull(fd, f.payload.data(), h.payloadBytes, deadline, what);
  return f;
}

}  // namespace loom::rpc::wire
