#include "signature.h"

#include <cstdio>

namespace loom::comm {

namespace {

// ReduceOp takes bits 48-50; bit 51 says the reduction is exact.
static_assert(static_cast<int>(ReduceOp::kBxor) < 8, "ReduceOp fits in 3 bits");
constexpr uint64_t kExactBit = uint64_t{1} << 51;

uint64_t head(OpType type, DType dtype, bool reduces, ReduceOp op, bool rooted, int root,
              bool exact = false) {
  const uint64_t rootField = rooted ? (static_cast<uint64_t>(root) % 0xffffu) + 1 : 0;
  return (uint64_t{1} << 63) | (uint64_t{static_cast<uint8_t>(type) & 0x7fu} << 56) |
         (uint64_t{static_cast<uint8_t>(dtype) & 0xfu} << 52) |
         (reduces ? uint64_t{static_cast<uint8_t>(op) & 0x7u} << 48 : 0) | (exact ? kExactBit : 0) |
         (rootField << 32);
}

}  // namespace

Signature packSignature(OpType type, DType dtype, uint64_t count, bool reduces, ReduceOp op,
                        bool rooted, int root, bool exact) {
  return {head(type, dtype, reduces, op, rooted, root, exact) | (count & 0xffffffffu), count >> 32};
}

Signature packUnevenSignature(OpType type, DType dtype, bool reduces, ReduceOp op, bool rooted,
                              int root, uint64_t digest) {
  return {head(type, dtype, reduces, op, rooted, root), digest};
}

uint64_t countsDigest(std::span<const size_t> counts) {
  // FNV-1a over the length and each count's 8 bytes, then a final mix (splitmix64's).
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(counts.size());
  for (const size_t c : counts) mix(c);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h != 0 ? h : 1;
}

bool isUneven(OpType type) {
  return type == OpType::kAlltoallv || type == OpType::kAllgatherv || type == OpType::kGatherv ||
         type == OpType::kReduceScatterv;
}

std::string describeSignature(const Signature& s) {
  if (!s.known()) return "(no signature)";
  const uint64_t w = s.word;
  const auto type = static_cast<OpType>((w >> 56) & 0x7f);
  std::string out = opTypeName(type);
  if (type == OpType::kBarrier) return out + "()";
  out += std::string("(dtype=") + dtypeName(static_cast<DType>((w >> 52) & 0xf));
  if (isUneven(type)) {
    out += ", block of " + std::to_string(w & 0xffffffffu) + " elements";
    if (s.extra != 0) {
      char digest[32];
      std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(s.extra));
      out += std::string(", counts digest 0x") + digest;
    }
  } else {
    out += ", count=" + std::to_string((s.extra << 32) | (w & 0xffffffffu));
  }
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kReduceScatter:
    case OpType::kReduce:
    case OpType::kReduceScatterv:
      out += std::string(", op=") + reduceOpName(static_cast<ReduceOp>((w >> 48) & 0x7));
      if ((w & kExactBit) != 0) out += ", exact";
      break;
    default:
      break;
  }
  const uint64_t root = (w >> 32) & 0xffffu;
  if (root != 0) out += ", root=" + std::to_string(root - 1);
  return out + ")";
}

}  // namespace loom::comm
