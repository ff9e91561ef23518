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

namespace {

// Payloads nesting deeper than this are refused: nlohmann's MessagePack reader recurses once per
// level, so a payload of nested one-element arrays (one byte a level) would overflow the stack
// of the thread that decodes it -- the RPC server's, for any peer that can connect.
constexpr size_t kMaxDepth = 512;

// nlohmann's DOM builder (what from_msgpack uses), stopping the reader at kMaxDepth.
class DepthLimitedBuilder {
 public:
  explicit DepthLimitedBuilder(Value& out) : dom_(out, true) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Value::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Value::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Value::number_float_t v, const Value::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(Value::string_t& v) { return dom_.string(v); }
  bool binary(Value::binary_t& v) { return dom_.binary(v); }
  bool key(Value::string_t& v) { return dom_.key(v); }
  bool start_object(size_t n) { return deeper() && dom_.start_object(n); }
  bool end_object() { return --depth_, dom_.end_object(); }
  bool start_array(size_t n) { return deeper() && dom_.start_array(n); }
  bool end_array() { return --depth_, dom_.end_array(); }
  bool parse_error(size_t at, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(at, token, e);
  }
  bool tooDeep() const { return tooDeep_; }

 private:
  bool deeper() {
    tooDeep_ = ++depth_ > kMaxDepth;
    return !tooDeep_;
  }
  nlohmann::detail::json_sax_dom_parser<Value> dom_;
  size_t depth_ = 0;
  bool tooDeep_ = false;
};

}  // namespace

Value decode(const uint8_t* data, size_t size) {
  if (size == 0) return Value();
  Value out;
  DepthLimitedBuilder builder(out);
  bool ok = false;
  try {
    ok = Value::sax_parse(data, data + size, &builder, Value::input_format_t::msgpack, true);
  } catch (const Value::exception& e) {
    LOOM_THROW(InvalidArgumentError, "malformed RPC payload (", size,
               " bytes of MessagePack): ", e.what());
  }
  if (builder.tooDeep()) {
    LOOM_THROW(InvalidArgumentError, "malformed RPC payload (", size,
               " bytes of MessagePack): nested deeper than ", kMaxDepth, " levels");
  }
  LOOM_CHECK(ok, "malformed RPC payload (", size, " bytes of MessagePack)");
  return out;
}

}  // namespace loom::rpc
