// Transport: tagged point-to-point messages between the ranks of one Context. The collective
// algorithms are written once over this interface; tcp (sockets), shm (shared memory, peers on
// this host) and verbs (RDMA) implement it, on one request core and one tag matcher
// (comm/src/request_core.h, comm/src/tag_matcher.h).
//
// Contract
// - Host memory only: every buffer is ordinary CPU-addressable memory (device buffers go
//   through a backend of their own, e.g. nccl).
// - isend/irecv start a transfer of `bytes` bytes to/from `peer` and return a Request at once.
//   The caller keeps the buffer alive and untouched until the Request completed (or the
//   transport was aborted: after abort() returns, the transport never touches any buffer).
// - Matching: a receive matches the oldest message from the same peer with the same tag, so
//   messages with equal tags between one pair arrive in the order they were sent. A message
//   whose tag matches but whose size differs is an InvalidArgumentError on the receiving side
//   (the ranks called collectives with different arguments); the transport then fails as
//   after an IoError (every other pending and future request throws IoError).
// - Receives posted before the data arrives land directly in the caller's buffer; data that
//   arrives first waits in an unexpected-message queue and is copied when the receive is
//   posted (a message still arriving then moves over: the rest lands in the caller's buffer).
// - Request::wait(deadline) returns true when the transfer completed and false when the
//   deadline passed first (the algorithm layer turns that into a TimeoutError naming the
//   operation, sequence number, peer and bytes outstanding). It throws IoError when the peer
//   failed or the transport was aborted, InvalidArgumentError for a size mismatch (above).
// - A peer that closes its connection without saying goodbye (crash, kill, abort) or resets
//   it fails every pending and future request on this transport fast with an IoError naming
//   that peer. A peer that said goodbye (its Context was destroyed after its last collective)
//   only fails later requests addressed to it.
// - registerBuffer / unregisterBuffer: memory an algorithm will send from or receive into
//   repeatedly. registerBuffer returns a RegisteredBuffer handle; unregisterBuffer takes it
//   back (after every request on the buffer completed). verbs registers the memory with the
//   NIC (sends from it go zero-copy, and the handle's remote key would let a peer RDMA-write
//   into it); for tcp and shm it is a no-op and the handle carries no key. Optional for the
//   caller; a failed registration is no error (rkey 0: the transport copies instead).
// - Thread-safety: isend/irecv/abort may be called from any thread; a Request is waited on by
//   one thread at a time. Implementations drive the wire on their own progress thread, and may
//   let the waiting thread do the I/O itself to save wake-ups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/common/deadline.h"

namespace loom::comm {

class Request {
 public:
  virtual ~Request() = default;

  // True when complete; throws the transfer's error (IoError, or InvalidArgumentError for a
  // size mismatch) when it failed. Never blocks.
  virtual bool test() = 0;
  // Blocks until complete (true) or the deadline passed (false); throws as test() on failure.
  virtual bool wait(const Deadline& deadline) = 0;

  virtual int peer() const = 0;
  virtual bool isSend() const = 0;
  virtual size_t bytes() const = 0;
  virtual uint64_t tag() const = 0;
  // Bytes not yet transferred (for timeout messages).
  virtual size_t bytesOutstanding() const = 0;
};

using RequestPtr = std::shared_ptr<Request>;

// What registerBuffer returns: the buffer, and where the transport has one, the key a peer
// needs to access it remotely.
struct RegisteredBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  uint32_t rkey = 0;  // verbs: the memory region's remote key; 0: not registered remotely
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const = 0;  // "tcp"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual RequestPtr isend(int peer, const void* data, size_t bytes, uint64_t tag) = 0;
  virtual RequestPtr irecv(int peer, void* data, size_t bytes, uint64_t tag) = 0;

  virtual RegisteredBuffer registerBuffer(const void* data, size_t bytes) {
    return {const_cast<void*>(data), bytes, 0};
  }
  virtual void unregisterBuffer(const RegisteredBuffer& /*buffer*/) {}

  // Fails every blocked and future request with IoError(reason); thread-safe, idempotent
  // (the first reason wins).
  virtual void abort(const std::string& reason) = 0;
  // True once the transport failed or was aborted.
  virtual bool failed() const = 0;

  // For error messages: the peer's address, and what arrived from the peer but was never
  // received (unexpected messages), e.g. after a collective mismatch.
  virtual std::string peerAddress(int peer) const = 0;
  virtual std::string describeUnexpected(int peer) const = 0;
  // Whether a message with `tag` from `peer` arrived (or is arriving) that no receive took
  // yet: an irecv posted now would match it. Never blocks; for receives from any source.
  virtual bool probe(int peer, uint64_t tag) const = 0;
  // Payload bytes that arrived before their receive was posted and were copied through a
  // buffer of their own (an allocation and a second copy each), since creation: a counter
  // for algorithms that mean to post their receives in time. 0 where not counted.
  virtual uint64_t unexpectedBytes() const { return 0; }
};

}  // namespace loom::comm
