#include "loom/store/store_protocol.h"

#include <charconv>
#include <cstring>

#include "loom/common/error.h"

namespace loom::store_protocol {
namespace {

void putU16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void putU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

uint64_t getBE(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// Reads payload fields with bounds checks; every failure records why and stops.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}

  bool u32(uint32_t& v, const char* what) {
    if (!need(4, what)) return false;
    v = static_cast<uint32_t>(getBE(p_, 4));
    advance(4);
    return true;
  }
  bool i64(int64_t& v, const char* what) {
    if (!need(8, what)) return false;
    v = static_cast<int64_t>(getBE(p_, 8));
    advance(8);
    return true;
  }
  bool bytes(size_t n, const uint8_t*& out, const char* what) {
    if (!need(n, what)) return false;
    out = p_;
    advance(n);
    return true;
  }
  size_t left() const { return left_; }
  std::string error;

 private:
  bool need(size_t n, const char* what) {
    if (left_ >= n) return true;
    error =
        detail::str("payload truncated reading ", what, " (need ", n, " bytes, ", left_, " left)");
    return false;
  }
  void advance(size_t n) {
    p_ += n;
    left_ -= n;
  }
  const uint8_t* p_;
  size_t left_;
};

DecodeResult fail(std::string why) {
  DecodeResult r;
  r.status = DecodeStatus::kError;
  r.error = std::move(why);
  return r;
}

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compareSet";
    case Op::kDelete:
      return "deleteKey";
    case Op::kCheck:
      return "check";
    case Op::kWait:
      return "wait";
    case Op::kNumKeys:
      return "numKeys";
    case Op::kMultiGet:
      return "multiGet";
    case Op::kMultiSet:
      return "multiSet";
    case Op::kCancel:
      return "cancel";
    case Op::kOk:
      return "ok";
    case Op::kError:
      return "error";
  }
  return "unknown";
}

bool isKnownOp(uint8_t op) {
  return (op >= static_cast<uint8_t>(Op::kHello) && op <= static_cast<uint8_t>(Op::kCancel)) ||
         op == static_cast<uint8_t>(Op::kOk) || op == static_cast<uint8_t>(Op::kError);
}

void encode(const Message& message, std::vector<uint8_t>& out) {
  LOOM_CHECK_LE(message.keys.size(), kMaxKeys, "too many keys in one ", opName(message.op));
  LOOM_CHECK_LE(message.values.size(), kMaxValues, "too many values in one ", opName(message.op));
  size_t payload = 8 + 4 + 4;
  for (const auto& key : message.keys) {
    LOOM_CHECK_LE(key.size(), kMaxKeyBytes, "store key is too long (", opName(message.op),
                  ", key starts \"", key.substr(0, 64), "\")");
    payload += 4 + key.size();
  }
  for (const auto& value : message.values) {
    LOOM_CHECK_LE(value.size(), kMaxValueBytes, "store value is too large (", opName(message.op),
                  ")");
    payload += 4 + value.size();
  }
  LOOM_CHECK_LE(payload, kMaxPayloadBytes, "store message is too large (", opName(message.op), ", ",
                message.keys.size(), " keys, ", message.values.size(), " values)");
  out.reserve(out.size() + kHeaderBytes + payload);
  putU32(out, kMagic);
  putU16(out, kProtocolVersion);
  out.push_back(static_cast<uint8_t>(message.op));
  out.push_back(0);
  putU64(out, message.id);
  putU64(out, payload);
  putU64(out, static_cast<uint64_t>(message.number));
  putU32(out, static_cast<uint32_t>(message.keys.size()));
  for (const auto& key : message.keys) {
    putU32(out, static_cast<uint32_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
  }
  putU32(out, static_cast<uint32_t>(message.values.size()));
  for (const auto& value : message.values) {
    putU32(out, static_cast<uint32_t>(value.size()));
    out.insert(out.end(), value.begin(), value.end());
  }
}

std::vector<uint8_t> encode(const Message& message) {
  std::vector<uint8_t> out;
  encode(message, out);
  return out;
}

DecodeResult decode(const uint8_t* data, size_t size, Message& out) {
  // The magic is checked byte by byte so that garbage is refused at its first byte.
  const uint8_t magic[4] = {static_cast<uint8_t>(kMagic >> 24), static_cast<uint8_t>(kMagic >> 16),
                            static_cast<uint8_t>(kMagic >> 8), static_cast<uint8_t>(kMagic)};
  for (size_t i = 0; i < 4 && i < size; ++i) {
    if (data[i] != magic[i]) {
      return fail(detail::str("bad magic number (byte ", i, " is 0x", std::hex,
                              static_cast<int>(data[i]), ", expected 0x",
                              static_cast<int>(magic[i]), "): not a Loom store client"));
    }
  }
  if (size < kHeaderBytes) return {};
  const auto version = static_cast<uint16_t>(getBE(data + 4, 2));
  if (version != kProtocolVersion) {
    return fail(detail::str("protocol version ", version, " is not supported (this server speaks ",
                            kProtocolVersion, ")"));
  }
  const uint8_t op = data[6];
  if (!isKnownOp(op)) return fail(detail::str("unknown op ", static_cast<int>(op)));
  if (data[7] != 0) return fail(detail::str("non-zero flags ", static_cast<int>(data[7])));
  const uint64_t id = getBE(data + 8, 8);
  const uint64_t length = getBE(data + 16, 8);
  if (length > kMaxPayloadBytes) {
    return fail(detail::str("frame payload of ", length, " bytes exceeds the limit of ",
                            kMaxPayloadBytes, " bytes"));
  }
  if (length < 16) {
    return fail(detail::str("frame payload of ", length, " bytes is shorter than the 16 fixed"));
  }
  if (size - kHeaderBytes < length) return {};

  Message m;
  m.op = static_cast<Op>(op);
  m.id = id;
  Reader r(data + kHeaderBytes, static_cast<size_t>(length));
  uint32_t nkeys = 0;
  if (!r.i64(m.number, "number") || !r.u32(nkeys, "key count")) return fail(r.error);
  if (nkeys > kMaxKeys) {
    return fail(detail::str(nkeys, " keys in one frame exceeds the limit of ", kMaxKeys));
  }
  // Each key needs at least its 4-byte length: refuse counts the payload cannot hold before
  // reserving anything.
  if (nkeys > r.left() / 4) return fail(detail::str("key count ", nkeys, " exceeds the payload"));
  m.keys.reserve(nkeys);
  for (uint32_t i = 0; i < nkeys; ++i) {
    uint32_t len = 0;
    const uint8_t* p = nullptr;
    if (!r.u32(len, "key length")) return fail(r.error);
    if (len > kMaxKeyBytes) {
      return fail(detail::str("key of ", len, " bytes exceeds the limit of ", kMaxKeyBytes));
    }
    if (!r.bytes(len, p, "key")) return fail(r.error);
    m.keys.emplace_back(reinterpret_cast<const char*>(p), len);
  }
  uint32_t nvalues = 0;
  if (!r.u32(nvalues, "value count")) return fail(r.error);
  if (nvalues > kMaxValues) {
    return fail(detail::str(nvalues, " values in one frame exceeds the limit of ", kMaxValues));
  }
  if (nvalues > r.left() / 4) {
    return fail(detail::str("value count ", nvalues, " exceeds the payload"));
  }
  m.values.reserve(nvalues);
  for (uint32_t i = 0; i < nvalues; ++i) {
    uint32_t len = 0;
    const uint8_t* p = nullptr;
    if (!r.u32(len, "value length")) return fail(r.error);
    if (len > kMaxValueBytes) {
      return fail(detail::str("value of ", len, " bytes exceeds the limit of ", kMaxValueBytes));
    }
    if (!r.bytes(len, p, "value")) return fail(r.error);
    m.values.emplace_back(p, p + len);
  }
  if (r.left() != 0) {
    return fail(detail::str(r.left(), " unexpected trailing byte(s) after the last value"));
  }
  out = std::move(m);
  DecodeResult result;
  result.status = DecodeStatus::kOk;
  result.consumed = kHeaderBytes + static_cast<size_t>(length);
  return result;
}

bool parseInt64(const Bytes& value, int64_t& out) {
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, out);
  return ec == std::errc() && ptr == end && !value.empty();
}

}  // namespace loom::store_protocol
