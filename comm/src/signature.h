// The wire signature of a collective: what must agree between ranks for one collective (op,
// dtype, count, reduce op, root), packed into one 64-bit word that travels in the header of
// every message of the collective, so that the receiver of the first message finds a mismatch
// at once and fails the collective on both sides (the transport fails as a whole, and its peers
// learn why) with both signatures in the error, without a message of its own.
//
// Layout: bit 63 set (0 = no signature: point-to-point, or a transport that carries none),
// OpType in bits 56-62, DType in 52-55, ReduceOp in 48-51 (0 when the op does not reduce), the
// root + 1 in 32-47 (0 when not rooted; roots past 65534 are folded), the count's low 32 bits in
// 0-31 (0 for the uneven collectives, whose counts differ by design).
//
// How it reaches the header: collectives.cc opens a SignatureScope for the collective on the
// calling thread; RequestCore (request_core.h) takes the thread's current signature when a
// transport creates a request, so no Transport method changes. A progress thread creates no
// request, and a send / recv outside a collective carries 0.
#pragma once

#include <cstdint>
#include <string>

#include "loom/comm/types.h"

namespace loom::comm {

uint64_t packSignature(OpType type, DType dtype, uint64_t count, bool reduces, ReduceOp op,
                       bool rooted, int root);
// "allreduce(dtype=float, count=1000, op=sum)", "broadcast(dtype=float, count=8, root=1)".
std::string describeSignature(uint64_t signature);

// Sets the calling thread's current signature for its lifetime (nests: restores the outer one).
class SignatureScope {
 public:
  explicit SignatureScope(uint64_t signature) : outer_(current_) { current_ = signature; }
  ~SignatureScope() { current_ = outer_; }
  SignatureScope(const SignatureScope&) = delete;
  SignatureScope& operator=(const SignatureScope&) = delete;

  // The calling thread's current signature (0: none).
  static uint64_t current() { return current_; }

 private:
  static inline thread_local uint64_t current_ = 0;
  const uint64_t outer_;
};

}  // namespace loom::comm
