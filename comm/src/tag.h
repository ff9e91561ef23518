// Message tags used by the collectives: one 64-bit tag = op kind (8 bits) | sequence number
// (40 bits) | step (16 bits). The transport matches on the whole tag, so a message of the
// next collective (peer ahead of us) waits in the unexpected queue instead of being taken
// for this one, and error messages can name the collective a stray message belongs to.
// Point-to-point messages carry kind OpType::kSend (on both sides, so that a send matches its
// recv) and the user's tag (< 2^56) in the rest.
#pragma once

#include <cstdint>
#include <string>

#include "loom/comm/types.h"

namespace loom::comm {

// The wire kind of point-to-point messages.
constexpr OpType kPointToPointKind = OpType::kSend;

constexpr uint64_t kMaxSeq = (uint64_t{1} << 40) - 1;
constexpr uint64_t kMaxP2PTag = (uint64_t{1} << 56) - 1;

inline uint64_t makeTag(OpType kind, uint64_t seq, uint32_t step) {
  return (uint64_t{static_cast<uint8_t>(kind)} << 56) | ((seq & kMaxSeq) << 16) | (step & 0xffffu);
}
inline uint64_t makeP2PTag(uint64_t userTag) {
  return (uint64_t{static_cast<uint8_t>(kPointToPointKind)} << 56) | (userTag & kMaxP2PTag);
}
inline OpType tagKind(uint64_t tag) {
  return static_cast<OpType>(tag >> 56);
}
inline bool isPointToPointTag(uint64_t tag) {
  return tagKind(tag) == kPointToPointKind;
}
inline uint64_t tagSeq(uint64_t tag) {
  return (tag >> 16) & kMaxSeq;
}
inline uint32_t tagStep(uint64_t tag) {
  return static_cast<uint32_t>(tag & 0xffffu);
}

// "allreduce#17 step 3", "send/recv tag 5".
std::string describeTag(uint64_t tag);

}  // namespace loom::comm
