// The RPC wire format: one connection per (caller, callee) pair, carrying frames both ways.
//
// A frame is a 40-byte header, then `nameBytes` of function name, then `payloadBytes` of
// MessagePack. Fields are little-endian (static_assert'ed: the machines of a job are x86-64 or
// arm64, both little-endian). The caller sends kHello once, then requests (kRequest, kRemote,
// kFetch, each with a call id the reply echoes, and kDelete, one-way); the callee answers each
// request with kResult (payload: the Value) or kError (payload: {"type", "message"}).
// `timeoutMs` tells the callee how long the caller will wait, so a request that waited in the
// callee's queue past it is dropped instead of run. `aux` carries an RRef id.
//
// Before any frame, the caller and the callee run the authentication handshake of
// loom/store/peer_auth.h (the caller's opening is an Opening; the key is the one the first
// worker put under "<prefix>/auth-key" in the store; docs/rpc.md): a connection without the key
// never gets to send a frame.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loom/common/deadline.h"

namespace loom::rpc::wire {

constexpr uint32_t kMagic = 0x4350524cu;  // "LRPC"
// 2: connections open with the authentication handshake (Opening).
constexpr uint8_t kVersion = 2;
constexpr size_t kMaxNameBytes = 4096;

enum class Kind : uint8_t {
  kHello = 1,    // name: the caller's worker name; id: the caller's rank
  kRequest = 2,  // name: function; payload: args
  kRemote = 3,   // name: function; payload: args; aux: the RRef id to keep the result under
  kFetch = 4,    // aux: the RRef id; answered once the value exists
  kDelete = 5,   // aux: the RRef id; no answer
  kResult = 6,   // id: the call answered; payload: the Value
  kError = 7,    // id: the call answered; payload: {"type": ..., "message": ...}
};

const char* kindName(Kind kind);

// The caller's opening of the authentication handshake (peer_auth.h): who calls whom, and the
// caller's nonce. The MACs cover all of it.
constexpr uint32_t kAuthMagic = 0x4150524cu;  // "LRPA"
constexpr std::string_view kAuthLabel = "loom-rpc";
struct Opening {
  uint32_t magic = kAuthMagic;
  uint32_t version = kVersion;
  int32_t rank = -1;  // the caller
  int32_t to = -1;    // the callee
  uint8_t nonce[16] = {};
};
static_assert(sizeof(Opening) == 32, "the RPC opening is 32 bytes on the wire");

struct Header {
  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t kind = 0;
  uint16_t reserved = 0;
  uint32_t timeoutMs = 0;
  uint32_t nameBytes = 0;
  uint64_t id = 0;
  uint64_t aux = 0;
  uint64_t payloadBytes = 0;
};
static_assert(sizeof(Header) == 40, "the RPC header is 40 bytes on the wire");

struct Frame {
  Header header;
  std::string name;
  std::vector<uint8_t> payload;
  Kind kind() const { return static_cast<Kind>(header.kind); }
};

// Writes header, name and payload in one send. `what` names the peer for errors.
void writeFrame(int fd, Kind kind, uint64_t id, uint64_t aux, uint32_t timeoutMs,
                const std::string& name, const std::vector<uint8_t>& payload,
                const Deadline& deadline, const std::string& what);

// Reads one frame; IoError on a closed connection, a bad magic or version, or a frame over
// `maxBytes`; TimeoutError when the frame does not arrive whole before the deadline.
Frame readFrame(int fd, size_t maxBytes, const Deadline& deadline, const std::string& what);

}  // namespace loom::rpc::wire
