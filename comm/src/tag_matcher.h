// TagMatcher: one peer's receive side of a transport, the same for tcp, shm and verbs: the
// receives posted for messages from that peer, the messages that arrived before their
// receive (unexpected), and the message whose payload is arriving now (incoming). The
// matching rule is transport.h's: a message lands in the oldest posted receive with its tag;
// a receive takes the oldest message that arrived with its tag; their sizes must agree.
//
// Division of work: the transport owns the wire. It reports a message's header (arrive()),
// writes the payload at incoming().target + incoming().got and reports the bytes (arrived()),
// and says when the payload is complete (finishIncoming()). For a message nobody posted a
// receive for yet it either buffers the payload (bufferIncoming()) or leaves it on the wire
// for now (tcp, large messages: the incoming message is then "held", target null). A
// receive is matched first (receive()); if nothing matched, the transport checks the peer's
// connection and then queues it (post()).
//
// A receive posted while its message is still arriving into an unexpected buffer takes that
// message over: what came so far is copied, the rest lands in the receive's buffer directly.
//
// Mismatches come back as an error text; the transport then fails as a whole (the ranks no
// longer agree on what they run):
// - sizes differ: the receive fails with InvalidArgumentError naming both sizes;
// - a message and a receive with the same sequence number but another collective (tag.h);
// - a message and a receive of the same collective (same sequence number, any step) whose
//   signatures (signature.h) differ: the ranks called the collective with different arguments
//   (dtype, count, reduce op, root, split sizes). Checked when both carry one; the error prints
//   both;
// - a message of another sequence number while a receive waits for one of this collective that
//   has not come (arrived after it, or is queued when the receive is posted): a peer's
//   messages reach its matcher in the order it sent them and a rank runs one collective at a
//   time, so the peer left or skipped this collective and will not send it. Found at the first
//   such message instead of at the deadline. Requires that every transport deliver one peer's
//   messages to a matcher in send order (tcp per lane, shm ring, verbs queue pair), and that
//   no two collectives of one Context have receives posted at once.
//
// Not thread-safe: every call under the lock that guards this peer's receive side.
#pragma once

#include <atomic>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "request_core.h"

namespace loom::comm {

// A message that arrived before its receive was posted.
struct UnexpectedMessage {
  uint64_t tag = 0;
  size_t bytes = 0;
  Signature signature;
  bool complete = false;            // all of the payload is in `data`
  std::unique_ptr<uint8_t[]> data;  // `bytes` (at least 1), not zeroed
};

class TagMatcher {
 public:
  using ReceivePtr = std::shared_ptr<RequestCore>;

  // The message being read from the wire.
  struct Incoming {
    bool active = false;
    uint64_t tag = 0;
    size_t bytes = 0;
    Signature signature;                      // the sender's (signature.h); unknown: none
    size_t got = 0;                           // payload bytes written to `target` so far
    uint8_t* target = nullptr;                // request's or unexpected's buffer; null while held
    ReceivePtr request;                       // the receive it lands in, or
    UnexpectedMessage* unexpected = nullptr;  // the buffer it waits in (owned by the queue)
  };

  // What receive() did with a new receive.
  enum class Match {
    kNone,      // no message for it yet: check the connection, then post() it
    kDone,      // an unexpected message was copied into it; it is complete
    kArriving,  // it is now the incoming message's target (held: resume reading)
    kError,     // a mismatch (the error text): fail the transport
  };

  // `rank` (this rank) and `peer` are for error messages.
  TagMatcher(int rank, int peer) : rank_(rank), peer_(peer) {}

  // ---- the wire side ----

  // A data message's header was read: it becomes the incoming message and lands in the oldest
  // posted receive with its tag (true). False when none is posted, or on a mismatch (`error`
  // set): then the transport buffers it or holds it.
  // `signature`: the one the header carried (unknown: none).
  bool arrive(uint64_t tag, size_t bytes, const Signature& signature, std::string& error);
  // The incoming message (no receive posted for it) goes into a new unexpected buffer. False,
  // with `error` naming the peer, the message and its size, when it cannot be buffered: larger
  // than maxBufferBytes() or out of memory. The transport then fails as a whole.
  [[nodiscard]] bool bufferIncoming(std::string& error);
  // The largest message bufferIncoming() tries to allocate: this machine's physical memory.
  static size_t maxBufferBytes();
  // `n` more payload bytes were written at incoming().target + incoming().got.
  void arrived(size_t n) {
    in_.got += n;
    if (in_.request) in_.request->setBytesDone(in_.got);
  }
  // The incoming payload is complete: its receive completes (returns true) or its unexpected
  // buffer becomes takeable.
  bool finishIncoming();
  Incoming& incoming() { return in_; }
  const Incoming& incoming() const { return in_; }
  bool held() const { return in_.active && in_.target == nullptr; }

  // ---- the receive side ----

  Match receive(const ReceivePtr& request, std::string& error);
  void post(ReceivePtr request) { posted_.push_back(std::move(request)); }

  // A receive is posted or the incoming message lands in one: this rank waits for the peer.
  bool waiting() const { return !posted_.empty() || in_.request != nullptr; }
  // The tag of the receive that waits longest (when waiting()).
  uint64_t waitingTag() const { return in_.request ? in_.request->tag() : posted_.front()->tag(); }

  // Fails every receive waiting on this peer (posted, and the incoming message's) with
  // `reason`, plus the receive's tag when `nameTag`; forgets the incoming message (and its
  // unexpected buffer, which would never complete). The complete unexpected messages stay,
  // for describeUnexpected() and for receives still posted (a peer that closed after
  // sending them). `kind`: kInvalidArgument when the transport fails because the ranks' calls
  // disagree (here or on the rank that aborted it), so that every waiter's error says so.
  void failAll(const std::string& reason, bool nameTag = false,
               RequestCore::Failure kind = RequestCore::Failure::kIo);

  // What arrived from the peer and was never received, oldest first ("allreduce#5 step 2
  // (4096 bytes), ..."; at most kShown, then "..."); empty when nothing.
  std::string describeUnexpected() const;
  // Whether a message with `tag` arrived (or is arriving) that no receive took yet
  // (Transport::probe).
  bool hasUnexpected(uint64_t tag) const;
  // Payload bytes that were copied through a buffer of their own because no receive was
  // posted when they arrived, since creation (Transport::unexpectedBytes). Any thread.
  uint64_t bufferedBytes() const { return buffered_.load(std::memory_order_relaxed); }
  static constexpr size_t kShown = 4;

 private:
  std::string sizeMismatch(size_t sent, size_t received, uint64_t tag) const;
  std::string otherCollective(uint64_t sent, const Signature& sentSignature, uint64_t runs,
                              const Signature& runsSignature) const;
  // Non-empty when both signatures are known and differ.
  std::string signatureMismatch(const Signature& sent, const Signature& received,
                                uint64_t tag) const;
  // A message (`sent`) of another sequence number than the waiting receive (`runs`).
  std::string skippedCollective(uint64_t sent, const Signature& sentSignature, uint64_t runs,
                                const Signature& runsSignature) const;
  // Non-empty when a message (`sent`) and a receive (`runs`) of different tags belong to the
  // same sequence number but another collective, to the same collective with another
  // signature, or to another sequence number (the peer left or skipped the receive's
  // collective).
  std::string disagreement(uint64_t sent, const Signature& sentSignature, uint64_t runs,
                           const Signature& runsSignature) const;

  const int rank_;
  const int peer_;
  std::deque<ReceivePtr> posted_;                              // oldest first
  std::deque<std::unique_ptr<UnexpectedMessage>> unexpected_;  // oldest first
  Incoming in_;
  std::atomic<uint64_t> buffered_{0};
};

}  // namespace loom::comm
