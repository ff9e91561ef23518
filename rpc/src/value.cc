#include "loom/rpc/value.h"

#include "loom/common/error.h"

namespace loom::rpc {

std::vector<float> toFloats(const Value& v) {
  const Value::binary_t& blob = v.get_binary();
  LOOM_CHECK(blob.size() % sizeof(float) == 0, "a float blob must hold whole floats, got ",
             blob.size(), " bytes");
  std::vector<float> out(blob.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), blob.data(), blob.size());
  return out;
}

std::vector<uint8_t> encode(const Value& v) {
  return Value::to_msgpack(v);
}

Value decode(const uint8_t* data, size_t size) {
  if (size == 0) return Value();
  try {
    return Value::from_msgpack(data, data + size);
  } catch (const Value::exception& e) {
    LOOM_THROW(InvalidArgumentError, "malformed RPC payload (", size,
               " bytes of MessagePack): ", e.what());
  }
}

}  // namespace loom::rpc
