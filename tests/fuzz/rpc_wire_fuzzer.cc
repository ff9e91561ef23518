// libFuzzer target: the RPC wire (rpc/src/wire.cc, value.cc, the error payload in agent.cc). The
// input is what a peer sends on an RPC connection: it is written into a socket pair and read
// back with readFrame, frame after frame, as the server and the channels read; each frame's
// payload is decoded as the MessagePack Value it carries, and a kError payload as the remote
// error it reports.
//
// Properties:
// - readFrame accepts a frame with the right magic, version and kind within the size limits and
//   returns exactly the declared name and payload bytes; everything else (including the end of
//   the bytes) is an IoError, never another exception;
// - a frame read, written again with writeFrame and read back, is the same frame;
// - a payload decodes to a Value or is refused with InvalidArgumentError; a Value decoded
//   encodes to MessagePack that decodes and encodes to the same bytes;
// - a kError payload, however malformed, becomes a RemoteError (decodeError never throws).
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../../rpc/src/core.h"
#include "../../rpc/src/wire.h"
#include "fuzz_support.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/rpc/agent.h"
#include "loom/rpc/value.h"

namespace {

using namespace loom::rpc;
using loom::Deadline;

constexpr size_t kMaxBytes = 1 << 20;
const loom::milliseconds kWait{2000};

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) != 0) std::abort();
  }
  ~SocketPair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  void closeWriter() {
    ::close(fd[1]);
    fd[1] = -1;
  }
};

void checkPayload(const wire::Frame& f) {
  Value v;
  const bool ok = loom::fuzz::rejectsOnlyWith<loom::InvalidArgumentError>(
      [&] { v = decode(f.payload.data(), f.payload.size()); });
  if (ok) {
    const std::vector<uint8_t> once = encode(v);
    Value back;
    const bool again = loom::fuzz::rejectsOnlyWith<loom::InvalidArgumentError>(
        [&] { back = decode(once.data(), once.size()); });
    LOOM_FUZZ_CHECK(again, "encode()'s MessagePack is refused by decode()");
    LOOM_FUZZ_CHECK(encode(back) == once, "MessagePack does not round-trip");
  }
  if (f.kind() == wire::Kind::kError) {
    std::exception_ptr e;
    try {
      e = detail::decodeError(f.payload, "callee", f.name);
    } catch (const std::exception& x) {
      LOOM_FUZZ_CHECK(false, "decodeError threw: %s", x.what());
    }
    try {
      std::rethrow_exception(e);
    } catch (const RemoteError& r) {
      LOOM_FUZZ_CHECK(r.callee() == "callee", "callee lost");
    } catch (...) {
      LOOM_FUZZ_CHECK(false, "decodeError made something other than a RemoteError");
    }
  }
}

void checkRewrite(const wire::Frame& f) {
  SocketPair s;
  wire::writeFrame(s.fd[1], f.kind(), f.header.id, f.header.aux, f.header.timeoutMs, f.name,
                   f.payload, Deadline(kWait), "rewrite");
  const wire::Frame back = wire::readFrame(s.fd[0], kMaxBytes, Deadline(kWait), "rewrite");
  LOOM_FUZZ_CHECK(back.header.kind == f.header.kind && back.header.id == f.header.id &&
                      back.header.aux == f.header.aux &&
                      back.header.timeoutMs == f.header.timeoutMs && back.name == f.name &&
                      back.payload == f.payload,
                  "a frame written again reads back otherwise");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SocketPair s;
  // The input fits in the socket buffer (-max_len), so one write, then the peer hangs up.
  if (size > 0 && ::write(s.fd[1], data, size) != static_cast<ssize_t>(size)) std::abort();
  s.closeWriter();
  size_t used = 0;
  for (;;) {
    wire::Frame f;
    try {
      f = wire::readFrame(s.fd[0], kMaxBytes, Deadline(kWait), "fuzz peer");
    } catch (const loom::IoError& e) {
      break;  // a bad frame, or the end of the bytes: the connection is dropped
    } catch (const std::exception& e) {
      LOOM_FUZZ_CHECK(false, "readFrame threw something other than IoError: %s", e.what());
    }
    const wire::Header& h = f.header;
    LOOM_FUZZ_CHECK(h.magic == wire::kMagic && h.version == wire::kVersion, "bad magic accepted");
    LOOM_FUZZ_CHECK(h.kind >= 1 && h.kind <= 7, "unknown kind %d accepted", int(h.kind));
    LOOM_FUZZ_CHECK(h.nameBytes <= wire::kMaxNameBytes && h.payloadBytes <= kMaxBytes,
                    "oversized frame accepted");
    LOOM_FUZZ_CHECK(f.name.size() == h.nameBytes && f.payload.size() == h.payloadBytes,
                    "frame sizes differ from its header");
    const size_t frameBytes = sizeof(h) + f.name.size() + f.payload.size();
    LOOM_FUZZ_CHECK(used + frameBytes <= size, "read past the bytes sent");
    LOOM_FUZZ_CHECK(std::memcmp(data + used + sizeof(h), f.name.data(), f.name.size()) == 0 &&
                        (f.payload.empty() || std::memcmp(data + used + sizeof(h) + f.name.size(),
                                                          f.payload.data(), f.payload.size()) == 0),
                    "name or payload bytes differ from what was sent");
    used += frameBytes;
    checkPayload(f);
    checkRewrite(f);
  }
  return 0;
}
