// Op: the state of one running collective on one rank (name, sequence number, deadline) and
// the only way algorithms talk to the transport, so that every error they raise names the
// rank, the operation and its sequence number, the peer and the bytes outstanding, and so
// that a failed collective aborts the transport (no request may outlive the user's buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/deadline.h"
#include "tag.h"

namespace loom::comm {

// Message size of the chunked algorithms when no engine says otherwise
// (ContextOptions::chunkBytes; LOOM_CHUNK_BYTES's default).
constexpr size_t kDefaultChunkBytes = size_t{512} << 10;

class Op {
 public:
  // `chunkBytes`: the message size of the chunked, pipelined algorithms (the Context's
  // ContextOptions::chunkBytes, through its generic engine).
  Op(Context& ctx, OpType kind, const CollectiveOptions& opts,
     size_t chunkBytes = kDefaultChunkBytes);

  int rank() const { return rank_; }
  int size() const { return size_; }
  Context& context() { return ctx_; }
  size_t chunkBytes() const { return chunkBytes_; }
  // "allreduce#17"
  std::string name() const;

  RequestPtr send(int peer, const void* data, size_t bytes, uint32_t step);
  RequestPtr recv(int peer, void* data, size_t bytes, uint32_t step);
  // Point-to-point with an explicit transport tag.
  RequestPtr sendTagged(int peer, const void* data, size_t bytes, uint64_t tag);
  RequestPtr recvTagged(int peer, void* data, size_t bytes, uint64_t tag);

  void wait(const RequestPtr& request);
  void waitAll(std::vector<RequestPtr>& requests);

 private:
  [[noreturn]] void timedOut(const Request& request);
  [[noreturn]] void failed(const Request& request, const std::exception& e);

  Context& ctx_;
  Transport& transport_;
  const OpType kind_;
  const uint64_t seq_;
  const int rank_;
  const int size_;
  const milliseconds timeout_;
  const Deadline deadline_;
  const size_t chunkBytes_;
};

// "send to" / "receive from", for messages.
inline const char* directionName(const Request& r) {
  return r.isSend() ? "send to" : "receive from";
}

}  // namespace loom::comm
