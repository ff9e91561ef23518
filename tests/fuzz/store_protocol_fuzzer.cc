// libFuzzer target for the TCPStore protocol decoder (built only with clang, see
// CMakeLists.txt). Feeds arbitrary bytes to decode(), frame after frame as the server does,
// and checks that anything accepted re-encodes to an equal message. Random bytes rarely get
// past the magic number, so each input is also decoded as the payload of a frame with a valid
// header (op chosen by the first byte), which puts the fuzzer straight onto the field parser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "loom/store/store_protocol.h"

namespace {

using namespace loom::store_protocol;

void decodeAll(const uint8_t* data, size_t size);

std::vector<uint8_t> withValidHeader(const uint8_t* data, size_t size) {
  static const uint8_t kOps[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 64, 65};
  std::vector<uint8_t> frame = encode(Message{});
  frame.resize(kHeaderBytes);
  frame[6] = kOps[data[0] % sizeof(kOps)];
  uint64_t length = size - 1;
  for (int i = 23; i >= 16; --i, length >>= 8) frame[i] = static_cast<uint8_t>(length);
  frame.insert(frame.end(), data + 1, data + size);
  return frame;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  decodeAll(data, size);
  if (size > 0) {
    const auto framed = withValidHeader(data, size);
    decodeAll(framed.data(), framed.size());
  }
  return 0;
}

namespace {

void decodeAll(const uint8_t* data, size_t size) {
  size_t used = 0;
  while (used < size) {
    Message m;
    const DecodeResult r = decode(data + used, size - used, m);
    if (r.status != DecodeStatus::kOk) break;
    if (r.consumed == 0 || r.consumed > size - used) std::abort();
    used += r.consumed;
    const auto again = encode(m);
    Message back;
    if (decode(again.data(), again.size(), back).status != DecodeStatus::kOk) std::abort();
    if (back.keys != m.keys || back.values != m.values || back.number != m.number ||
        back.id != m.id || back.op != m.op) {
      std::abort();
    }
  }
}

}  // namespace
