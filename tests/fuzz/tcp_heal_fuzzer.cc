// libFuzzer target: the heal replay messages of the tcp transport (comm/src/tcp/tcp_heal.cc):
// the opening a re-dialling peer sends (a Hello with kResumeMagic, checked by isResumeFor, peer.h)
// and what the transport then sends again from its replay ring (planResend and ReplayRing,
// replay_ring.h), as acceptResume and installLocked use them.
//
// Input (FuzzedDataProvider): this rank's place (rank, size, lanes), a Hello as raw bytes, then
// a stream: the ring's capacity, the messages written to the connection (each appended to the
// ring once sent, as the transport keeps them), how much of the front message was written, and
// the peer's consumed count, taken near the stream's end so that the interesting cases come up.
//
// Properties:
// - a resume is taken only when its magic and version match, it is addressed to this rank, and
//   it names another rank of this world and a lane in range;
// - the ring holds exactly the last min(capacity, written) bytes of the stream;
// - planResend refuses exactly when the peer claims more than was written, or bytes older than
//   the ring holds; otherwise the bytes it replays followed by the front message from where it
//   resumes are exactly the stream from the peer's count on: nothing lost, nothing twice.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_support.h"
#include "tcp/peer.h"
#include "tcp/replay_ring.h"

namespace {

using namespace loom::comm::tcp;

void checkResume(FuzzedDataProvider& in) {
  const int size = in.ConsumeIntegralInRange<int>(1, 8);
  const int rank = in.ConsumeIntegralInRange<int>(0, size - 1);
  const int lanes = in.ConsumeIntegralInRange<int>(1, 4);
  Hello r{};
  const std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(sizeof(Hello));
  if (!raw.empty()) std::memcpy(&r, raw.data(), raw.size());
  // Often a well-formed one, so that the range checks are reached.
  if (in.ConsumeBool()) {
    r.magic = kResumeMagic;
    r.version = kHelloVersion;
    r.to = rank;
  }
  const bool taken = isResumeFor(r, rank, size, lanes);
  const bool expected = r.magic == kResumeMagic && r.version == kHelloVersion && r.to == rank &&
                        r.size == size && r.lanes == lanes && r.rank >= 0 && r.rank < size &&
                        r.rank != rank && r.lane >= 0 && r.lane < lanes;
  LOOM_FUZZ_CHECK(taken == expected,
                  "resume{rank %d, to %d, size %d, lane %d, lanes %d} taken=%d by "
                  "rank %d of %d with %d lanes",
                  r.rank, r.to, r.size, r.lane, r.lanes, int(taken), rank, size, lanes);
}

void checkResend(FuzzedDataProvider& in) {
  ReplayRing ring(in.ConsumeIntegralInRange<size_t>(0, 4096));
  std::vector<uint8_t> stream;  // every byte written to the connection, in order
  const int messages = in.ConsumeIntegralInRange<int>(0, 32);
  for (int m = 0; m < messages && in.remaining_bytes() > 0; ++m) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 3000);
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(stream.size() + i * 7 + m);
    ring.append(bytes.data(), bytes.size());
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  }
  LOOM_FUZZ_CHECK(ring.end() == stream.size(), "ring ends at %llu, stream at %zu",
                  static_cast<unsigned long long>(ring.end()), stream.size());
  LOOM_FUZZ_CHECK(ring.size() == std::min(ring.capacity(), stream.size()), "ring holds %zu",
                  ring.size());
  // The front message: partly written.
  const size_t frontBytes = in.ConsumeIntegralInRange<size_t>(0, 3000);
  std::vector<uint8_t> front(frontBytes);
  for (size_t i = 0; i < frontBytes; ++i) front[i] = static_cast<uint8_t>(0xa5 ^ i);
  const size_t frontOffset = in.ConsumeIntegralInRange<size_t>(0, frontBytes);
  const uint64_t written = stream.size() + frontOffset;
  // The peer's count: anywhere, but mostly near what was written.
  const uint64_t back = in.ConsumeIntegralInRange<uint64_t>(0, 2 * written + 64);
  const uint64_t peerConsumed = in.ConsumeBool()      ? back
                                : written + 16 > back ? written + 16 - back
                                                      : 0;
  std::vector<uint8_t> replay;
  size_t resumeAt = 0;
  const ResendPlan plan = planResend(ring, frontOffset, peerConsumed, replay, resumeAt);
  const uint64_t oldest = stream.size() - std::min(ring.capacity(), stream.size());
  const ResendPlan expected = peerConsumed > written  ? ResendPlan::kAheadOfWritten
                              : peerConsumed < oldest ? ResendPlan::kOlderThanRing
                                                      : ResendPlan::kOk;
  LOOM_FUZZ_CHECK(plan == expected,
                  "plan %d, expected %d (consumed %llu, written %llu, ring "
                  "from %llu)",
                  int(plan), int(expected), static_cast<unsigned long long>(peerConsumed),
                  static_cast<unsigned long long>(written),
                  static_cast<unsigned long long>(oldest));
  if (plan != ResendPlan::kOk) return;
  // What the peer gets from now on: the replay, then the front message from resumeAt.
  std::vector<uint8_t> sent = replay;
  LOOM_FUZZ_CHECK(resumeAt <= frontBytes, "resumes at %zu of a %zu-byte message", resumeAt,
                  frontBytes);
  sent.insert(sent.end(), front.begin() + static_cast<std::ptrdiff_t>(resumeAt), front.end());
  std::vector<uint8_t> expect(
      stream.begin() + static_cast<std::ptrdiff_t>(std::min<uint64_t>(peerConsumed, stream.size())),
      stream.end());
  const size_t intoFront = peerConsumed > stream.size() ? peerConsumed - stream.size() : 0;
  expect.insert(expect.end(), front.begin() + static_cast<std::ptrdiff_t>(intoFront), front.end());
  LOOM_FUZZ_CHECK(sent == expect, "the resent stream differs (%zu bytes, expected %zu)",
                  sent.size(), expect.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  checkResume(in);
  checkResend(in);
  return 0;
}
