// The wire protocol on its own: round trips, incremental decoding, every refusal, and a
// deterministic random-input fuzz of the decoder (the libFuzzer target in
// tools/loom_store/fuzz runs the same entry point when clang is available).
#include "loom/store/store_protocol.h"

#include <gtest/gtest.h>

#include <random>

#include "loom/common/error.h"

namespace loom::store_protocol {
namespace {

Message sample() {
  Message m;
  m.op = Op::kMultiSet;
  m.id = 0x0102030405060708ull;
  m.number = -42;
  m.keys = {"a", std::string(kMaxKeyBytes, 'k'), "key/with/slashes"};
  m.values = {Bytes{}, Bytes{0, 1, 2, 255}, toBytes("third")};
  return m;
}

void expectSame(const Message& a, const Message& b) {
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.number, b.number);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
}

void putBE(std::vector<uint8_t>& frame, size_t at, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8) frame[at + i] = static_cast<uint8_t>(v);
}

std::string decodeError(const std::vector<uint8_t>& frame) {
  Message m;
  auto r = decode(frame.data(), frame.size(), m);
  EXPECT_EQ(r.status, DecodeStatus::kError);
  return r.error;
}

TEST(StoreProtocol, RoundTripsEveryField) {
  const Message in = sample();
  const auto frame = encode(in);
  Message out;
  auto r = decode(frame.data(), frame.size(), out);
  ASSERT_EQ(r.status, DecodeStatus::kOk) << r.error;
  EXPECT_EQ(r.consumed, frame.size());
  expectSame(in, out);
}

TEST(StoreProtocol, DecodesIncrementallyAndBackToBack) {
  const auto frame = encode(sample());
  Message out;
  for (size_t n = 0; n < frame.size(); ++n) {
    auto r = decode(frame.data(), n, out);
    ASSERT_EQ(r.status, DecodeStatus::kNeedMore) << "at " << n << ": " << r.error;
  }
  std::vector<uint8_t> two = frame;
  const auto second = encode(Message{Op::kGet, 9, 0, {"x"}, {}});
  two.insert(two.end(), second.begin(), second.end());
  auto r = decode(two.data(), two.size(), out);
  ASSERT_EQ(r.status, DecodeStatus::kOk);
  ASSERT_EQ(r.consumed, frame.size());
  r = decode(two.data() + r.consumed, two.size() - r.consumed, out);
  ASSERT_EQ(r.status, DecodeStatus::kOk);
  EXPECT_EQ(out.op, Op::kGet);
  EXPECT_EQ(out.keys, std::vector<std::string>{"x"});
}

TEST(StoreProtocol, RefusesBadMagicAtTheFirstByte) {
  const std::vector<uint8_t> garbage = {'G'};
  EXPECT_NE(decodeError(garbage).find("bad magic"), std::string::npos);
  const std::vector<uint8_t> http = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};
  EXPECT_NE(decodeError(http).find("bad magic"), std::string::npos);
}

TEST(StoreProtocol, RefusesWrongVersionOpAndFlags) {
  auto frame = encode(sample());
  auto v = frame;
  putBE(v, 4, 2, 2);
  EXPECT_NE(decodeError(v).find("version 2"), std::string::npos);
  auto op = frame;
  op[6] = 200;
  EXPECT_NE(decodeError(op).find("unknown op 200"), std::string::npos);
  auto flags = frame;
  flags[7] = 1;
  EXPECT_NE(decodeError(flags).find("flags"), std::string::npos);
}

TEST(StoreProtocol, RefusesAHugeLengthFromTheHeaderAlone) {
  auto frame = encode(sample());
  frame.resize(kHeaderBytes);
  putBE(frame, 16, uint64_t{1} << 40, 8);
  const std::string error = decodeError(frame);
  EXPECT_NE(error.find("1099511627776 bytes exceeds the limit"), std::string::npos) << error;
  putBE(frame, 16, 3, 8);
  EXPECT_NE(decodeError(frame).find("shorter"), std::string::npos);
}

TEST(StoreProtocol, RefusesInconsistentPayloads) {
  // A key count larger than the payload can hold.
  Message m{Op::kCheck, 1, 0, {"a"}, {}};
  auto frame = encode(m);
  putBE(frame, kHeaderBytes + 8, 1000, 4);
  EXPECT_NE(decodeError(frame).find("key count 1000"), std::string::npos) << decodeError(frame);
  // A key length running past the end of the payload.
  frame = encode(m);
  putBE(frame, kHeaderBytes + 12, 50, 4);
  EXPECT_NE(decodeError(frame).find("truncated"), std::string::npos) << decodeError(frame);
  // Trailing bytes after the last value (length says more than the fields use).
  frame = encode(m);
  frame.push_back(0);
  putBE(frame, 16, frame.size() - kHeaderBytes, 8);
  EXPECT_NE(decodeError(frame).find("trailing"), std::string::npos);
  // A key over the limit, encoded by hand.
  frame = encode(Message{Op::kGet, 1, 0, {"k"}, {}});
  putBE(frame, kHeaderBytes + 12, kMaxKeyBytes + 1, 4);
  EXPECT_NE(decodeError(frame).find("limit"), std::string::npos);
}

TEST(StoreProtocol, EncodeRefusesWhatTheDecoderWould) {
  EXPECT_THROW(encode(Message{Op::kGet, 1, 0, {std::string(kMaxKeyBytes + 1, 'k')}, {}}),
               InvalidArgumentError);
  EXPECT_THROW(encode(Message{Op::kSet, 1, 0, {"k"}, {Bytes(kMaxValueBytes + 1)}}),
               InvalidArgumentError);
}

TEST(StoreProtocol, ParsesCountersStrictly) {
  int64_t v = 0;
  EXPECT_TRUE(parseInt64(toBytes("-12"), v));
  EXPECT_EQ(v, -12);
  EXPECT_FALSE(parseInt64(toBytes(""), v));
  EXPECT_FALSE(parseInt64(toBytes("12x"), v));
  EXPECT_FALSE(parseInt64(toBytes("99999999999999999999"), v));
}

// Deterministic fuzz: random bytes, random headers with valid magic, and mutations (bit flips,
// truncations, length rewrites) of valid frames. The decoder must never crash or read out of
// bounds (run under LOOM_SANITIZE=address to check that), must only ever consume what it was
// given, and whatever it accepts must re-encode to an equal message.
TEST(StoreProtocol, RandomInputsNeverBreakTheDecoder) {
  std::mt19937_64 rng(20261122);
  const std::vector<std::vector<uint8_t>> seeds = {
      encode(sample()),
      encode(Message{Op::kHello, 1, 3, {"client"}, {toBytes("token")}}),
      encode(Message{Op::kError, 7, 0, {"message"}, {}}),
      encode(Message{Op::kNumKeys, 2, 0, {}, {}}),
  };
  int accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::vector<uint8_t> input;
    const int mode = static_cast<int>(rng() % 4);
    if (mode == 0) {
      input.resize(rng() % 64);
      for (auto& b : input) b = static_cast<uint8_t>(rng());
    } else {
      input = seeds[rng() % seeds.size()];
      if (mode == 1) {
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) input[rng() % input.size()] ^= 1u << (rng() % 8);
      } else if (mode == 2) {
        input.resize(rng() % (input.size() + 1));
      } else if (input.size() >= kHeaderBytes + 16) {
        // Rewrite a count or a length field inside the payload to a random value.
        const size_t at = kHeaderBytes + 8 + 4 * (rng() % ((input.size() - kHeaderBytes - 8) / 4));
        putBE(input, at, rng() & 0xFFFFFFFF, 4);
      }
    }
    Message m;
    const auto r = decode(input.data(), input.size(), m);
    if (r.status != DecodeStatus::kOk) continue;
    ++accepted;
    ASSERT_LE(r.consumed, input.size());
    Message again;
    const auto reencoded = encode(m);
    ASSERT_EQ(decode(reencoded.data(), reencoded.size(), again).status, DecodeStatus::kOk);
    expectSame(m, again);
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace loom::store_protocol
