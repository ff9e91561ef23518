// The wire signature of a collective: what must agree between ranks for one collective (op,
// dtype, count, reduce op, root), packed into two 64-bit words that travel in the header of
// every message of the collective, so that the receiver of the first message finds a mismatch
// at once and fails the collective on both sides (the transport fails as a whole, and its peers
// learn why) with both signatures in the error, without a message of its own.
//
// Layout of `word`: bit 63 set (0 = no signature: point-to-point, or a transport that carries
// none), OpType in bits 56-62, DType in 52-55, ReduceOp in 48-50 (0 when the op does not
// reduce), in bit 51 whether the reduction is exact (the reproducible mode's n-ary shared-memory
// forms, shm/shm_rows.cc, which move their data as the ordinary collective does), the root + 1 in
// 32-47 (0 when not rooted; roots past 65534 are folded), and in 0-31 the count's low 32 bits.
// `extra`: the count's high 32 bits, so that counts are compared in 64 bits (the shared-memory
// arena, whose collectives are all even, keeps these 32 bits).
//
// The uneven collectives (alltoallv, allgatherv, gatherv, reduceScatterv), whose messages
// differ in size by design, carry instead in bits 0-31 the element count of the message's own
// block as this rank's counts give it (the sender's count for what it sends, the receiver's for
// what it expects from that peer), and in `extra` a 64-bit digest of the count vector every rank
// passes alike (countsDigest; 0 for alltoallv, whose per-rank vectors differ by design): two
// ranks whose split sizes differ anywhere fail at their first message with both.
//
// How it reaches the header: collectives.cc opens a SignatureScope for the collective on the
// calling thread; RequestCore (request_core.h) takes the thread's current signature when a
// transport creates a request, so no Transport method changes. A progress thread creates no
// request, and a send / recv outside a collective carries none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "loom/comm/types.h"

namespace loom::comm {

struct Signature {
  uint64_t word = 0;
  uint64_t extra = 0;
  // False for point-to-point messages and control: nothing to compare.
  bool known() const { return word != 0; }
  friend bool operator==(const Signature&, const Signature&) = default;
};

Signature packSignature(OpType type, DType dtype, uint64_t count, bool reduces, ReduceOp op,
                        bool rooted, int root, bool exact = false);
// An uneven collective's signature without its block (withBlock sets it per message).
Signature packUnevenSignature(OpType type, DType dtype, bool reduces, ReduceOp op, bool rooted,
                              int root, uint64_t countsDigest);
// `s` with the message's own block of `elements` (uneven collectives; low 32 bits compared).
inline Signature withBlock(Signature s, uint64_t elements) {
  s.word = (s.word & ~uint64_t{0xffffffffu}) | (elements & 0xffffffffu);
  return s;
}
// A 64-bit digest of a count vector (order and length matter; never 0).
uint64_t countsDigest(std::span<const size_t> counts);
// Whether `type` is one of the uneven collectives.
bool isUneven(OpType type);

// "allreduce(dtype=float, count=1000, op=sum)", "allreduce(dtype=float, count=8, op=sum,
// exact)", "broadcast(dtype=float, count=8, root=1)",
// "allgatherv(dtype=float, block of 3 elements, counts digest 0x...)".
std::string describeSignature(const Signature& signature);

// Sets the calling thread's current signature for its lifetime (nests: restores the outer one).
class SignatureScope {
 public:
  explicit SignatureScope(const Signature& signature) : outer_(current_) { current_ = signature; }
  ~SignatureScope() { current_ = outer_; }
  SignatureScope(const SignatureScope&) = delete;
  SignatureScope& operator=(const SignatureScope&) = delete;

  // The calling thread's current signature (unknown: none).
  static const Signature& current() { return current_; }

 private:
  static inline thread_local Signature current_{};
  const Signature outer_;
};

}  // namespace loom::comm
