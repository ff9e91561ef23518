// Message tags used by the collectives: one 64-bit tag = op kind (8 bits) | sequence number
// (40 bits) | step (16 bits). The transport matches on the whole tag, so a message of the
// next collective (peer ahead of us) waits in the unexpected queue instead of being taken
// for this one, and error messages can name the collective a stray message belongs to.
// Point-to-point send/recv use kind kP2P and carry the user's tag (< 2^56) in the rest.
#pragma once

#include <cstdint>
#include <string>

namespace loom::comm {

enum class OpKind : uint8_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kP2P,
};

const char* opKindName(OpKind kind);

constexpr uint64_t kMaxSeq = (uint64_t{1} << 40) - 1;
constexpr uint64_t kMaxP2PTag = (uint64_t{1} << 56) - 1;

inline uint64_t makeTag(OpKind kind, uint64_t seq, uint32_t step) {
  return (uint64_t{static_cast<uint8_t>(kind)} << 56) | ((seq & kMaxSeq) << 16) | (step & 0xffffu);
}
inline uint64_t makeP2PTag(uint64_t userTag) {
  return (uint64_t{static_cast<uint8_t>(OpKind::kP2P)} << 56) | (userTag & kMaxP2PTag);
}
inline OpKind tagKind(uint64_t tag) {
  return static_cast<OpKind>(tag >> 56);
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
