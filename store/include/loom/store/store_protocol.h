// The TCPStore wire protocol: framing, encoding and an incremental, bounds-checked decoder.
//
// Every message, in both directions, is one frame:
//
//   offset size  field
//   0      4     magic    0x4C4D5354 ("LMST"), big-endian
//   4      2     version  kProtocolVersion, big-endian
//   6      1     op       Op
//   7      1     flags    0 (reserved; non-zero is rejected)
//   8      8     id       request id chosen by the client; a reply carries its request's id
//   16     8     length   payload bytes that follow, big-endian (64-bit so that an absurd
//                         length is visible and refused rather than wrapped)
//   24     ...   payload  number:i64, nkeys:u32, (len:u32, bytes)*, nvalues:u32, (len:u32, bytes)*
//
// All integers are big-endian. Limits are hard: a key is 1..kMaxKeyBytes bytes, a value at
// most kMaxValueBytes, a frame at most kMaxKeys keys, kMaxValues values and kMaxPayloadBytes of
// payload. The decoder checks the magic as soon as the first byte arrives, and the version,
// flags, op and length as soon as the header is complete, so a hostile length is refused
// before anything is buffered. It never reads past the bytes it is given and never allocates
// more than the declared (already bounded) payload.
//
// Conversation: the first frame from a client is kHello (number = rank or -1, keys[0] = a
// client id that is the same on every connection of one TCPStore object, values[0] = token).
// The server replies kOk, or kError and closes. Then each request gets exactly one reply, in
// order: kOk with results, or kError with keys[0] = message. kGet and kWait wait on the server
// until their keys exist; kCancel{number = id of the wait} ends a pending wait: the server
// answers the wait (if it had not yet) with kError "cancelled", then answers the cancel with
// kOk, so a client that gave up reads at most one stale reply, which it recognises by id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/store/store.h"

namespace loom::store_protocol {

inline constexpr uint32_t kMagic = 0x4C4D5354;  // "LMST"
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;     // 64 MiB
inline constexpr size_t kMaxPayloadBytes = size_t{130} << 20;  // two max values + overhead
inline constexpr size_t kMaxKeys = 65536;
inline constexpr size_t kMaxValues = 65536;
inline constexpr size_t kMaxTokenBytes = 1024;

enum class Op : uint8_t {
  kHello = 1,
  kSet = 2,         // keys[0], values[0]
  kGet = 3,         // keys[0]; waits until present -> values[0]
  kAdd = 4,         // keys[0], number = delta -> number = new value
  kCompareSet = 5,  // keys[0], values = {expected, desired} -> values[0] = current
  kDelete = 6,      // keys[0] -> number = 1 when it existed
  kCheck = 7,       // keys -> number = 1 when all exist
  kWait = 8,        // keys; waits until all exist -> kOk
  kNumKeys = 9,     // -> number
  kMultiGet = 10,   // keys; waits until all exist -> values
  kMultiSet = 11,   // keys, values (same count)
  kCancel = 12,     // number = id of a pending kGet/kWait/kMultiGet
  kOk = 64,         // reply
  kError = 65,      // reply; keys[0] = message, number = 0 or kErrorIo
};

// kError's number when the server could not do what was asked for a reason of its own (its
// log cannot be written: a full disk), not because the request was wrong. The client raises
// an IoError for it instead of an InvalidArgumentError.
constexpr int64_t kErrorIo = 1;

const char* opName(Op op);
bool isKnownOp(uint8_t op);

struct Message {
  Op op = Op::kOk;
  uint64_t id = 0;
  int64_t number = 0;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
};

// Appends one encoded frame to `out`. Throws InvalidArgumentError when the message breaks a
// limit (so a client learns before sending); keys in kError replies may be any length up to
// kMaxKeyBytes and may be empty.
void encode(const Message& message, std::vector<uint8_t>& out);
std::vector<uint8_t> encode(const Message& message);

enum class DecodeStatus { kNeedMore, kOk, kError };

struct DecodeResult {
  DecodeStatus status = DecodeStatus::kNeedMore;
  size_t consumed = 0;  // bytes of one whole frame when kOk
  std::string error;    // what was wrong when kError
};

// Looks at the front of [data, data + size): kNeedMore when a frame is not complete yet (what
// is there so far is valid), kOk with `out` filled and `consumed` set, or kError naming the
// problem (bad magic, version, op, flags, oversized length, truncated or trailing payload
// fields, limits). Never throws.
DecodeResult decode(const uint8_t* data, size_t size, Message& out);

// Parses a decimal int64 value as stored by add(); false when the bytes are not one.
bool parseInt64(const Bytes& value, int64_t& out);

}  // namespace loom::store_protocol
