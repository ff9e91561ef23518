// libFuzzer target: the TCPStore protocol decoder (store/src/store_protocol.cc). Feeds arbitrary
// bytes to decode(), frame after frame as the server does. Random bytes rarely get past the
// magic number, so each input is also decoded as the payload of a frame with a valid header (op
// chosen by the first byte), which puts the fuzzer straight onto the field parser.
//
// Properties:
// - decode() never throws, never reads past the bytes it is given (ASan), and a frame it
//   accepts consumed between 1 and the bytes given;
// - every proper prefix of an accepted frame is kNeedMore (the server waits for the rest rather
//   than refusing a frame that arrives in pieces), and the frame decodes the same from a copy
//   of exactly its bytes;
// - anything accepted re-encodes to a frame that decodes to an equal message;
// - parseInt64 accepts exactly what std::to_string(int64) prints back identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_support.h"

#include "loom/store/store_protocol.h"

namespace {

using namespace loom::store_protocol;
using loom::Bytes;

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
    DecodeResult r;
    try {
      r = decode(data + used, size - used, m);
    } catch (const std::exception& e) {
      LOOM_FUZZ_CHECK(false, "decode threw: %s", e.what());
    }
    if (r.status == DecodeStatus::kError) LOOM_FUZZ_CHECK(!r.error.empty(), "an unnamed error");
    if (r.status != DecodeStatus::kOk) break;
    LOOM_FUZZ_CHECK(r.consumed > 0 && r.consumed <= size - used, "consumed %zu of %zu", r.consumed,
                    size - used);
    // The frame alone (a copy: ASan sees a read past it), and in pieces.
    const std::vector<uint8_t> frame(data + used, data + used + r.consumed);
    Message alone;
    LOOM_FUZZ_CHECK(decode(frame.data(), frame.size(), alone).status == DecodeStatus::kOk,
                    "the frame alone is refused");
    for (size_t cut : {size_t{0}, size_t{1}, kHeaderBytes - 1, kHeaderBytes, frame.size() - 1}) {
      if (cut >= frame.size()) continue;
      Message partial;
      const DecodeResult p = decode(frame.data(), cut, partial);
      LOOM_FUZZ_CHECK(p.status == DecodeStatus::kNeedMore,
                      "a %zu-byte prefix of a %zu-byte "
                      "frame is not kNeedMore: %s",
                      cut, frame.size(), p.error.c_str());
    }
    used += r.consumed;
    const auto again = encode(m);
    Message back;
    LOOM_FUZZ_CHECK(decode(again.data(), again.size(), back).status == DecodeStatus::kOk,
                    "encode()'s frame is refused");
    LOOM_FUZZ_CHECK(back.keys == m.keys && back.values == m.values && back.number == m.number &&
                        back.id == m.id && back.op == m.op,
                    "a message re-encoded decodes otherwise");
    for (const Bytes& v : m.values) {
      int64_t n = 0;
      if (parseInt64(v, n)) {
        const std::string printed = std::to_string(n);
        LOOM_FUZZ_CHECK(Bytes(printed.begin(), printed.end()) == v ||
                            (v.size() > 1 && (v[0] == '0' || (v[0] == '-' && v[1] == '0'))),
                        "parseInt64 accepted a value that does not print back (%s)",
                        printed.c_str());
      }
    }
  }
}

}  // namespace
