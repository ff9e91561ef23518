// Value: what RPC arguments and results are, and how they travel.
//
// A Value is an nlohmann::json: null, booleans, integers, floats, strings, arrays, objects and
// binary blobs. On the wire it is MessagePack (nlohmann's to_msgpack / from_msgpack), so numbers
// stay binary (a float that fits in 32 bits is sent as 4 bytes) and blobs are sent as raw bytes
// (msgpack bin), never base64. User types travel through nlohmann's to_json / from_json.
//
// args(a, b, ...) builds the argument array of a call (avoids brace-init surprises: json{x} is
// not always an array of one). floats(span) / toFloats(value) move a float32 vector as one blob.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::rpc {

using Value = nlohmann::json;

template <class... A>
Value args(A&&... a) {
  Value out = Value::array();
  (out.push_back(Value(std::forward<A>(a))), ...);
  return out;
}

// A float32 vector as one binary Value (4 bytes per element, host byte order: the peers of one
// job share an architecture).
inline Value floats(std::span<const float> data) {
  Value::binary_t blob(std::vector<uint8_t>(data.size() * sizeof(float)));
  if (!data.empty()) std::memcpy(blob.data(), data.data(), data.size() * sizeof(float));
  return Value::binary(std::move(blob));
}

// The inverse of floats(); throws Value's type_error when `v` is not a blob of whole floats.
std::vector<float> toFloats(const Value& v);

// MessagePack encoding of a Value, and back (InvalidArgumentError on malformed bytes, and on
// arrays and maps nested deeper than 512 levels).
std::vector<uint8_t> encode(const Value& v);
Value decode(const uint8_t* data, size_t size);

}  // namespace loom::rpc
