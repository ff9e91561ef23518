#include "tag_matcher.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "loom/common/error.h"
#include "signature.h"
#include "tag.h"

namespace loom::comm {

namespace {

// The collective a tag belongs to (its kind, without bit 63, which the tcp transport sets on the
// parts of a striped message), and whether a tag can be compared by sequence number at all:
// sequence 0 and point-to-point tags carry none.
uint64_t kindOf(uint64_t tag) {
  return (tag >> 56) & 0x7f;
}
bool hasSeq(uint64_t tag) {
  return tagSeq(tag) != 0 && !isPointToPointTag(tag);
}

// Same sequence number, other collective: the ranks run different collectives.
bool sameSeqOtherCollective(uint64_t a, uint64_t b) {
  return kindOf(a) != kindOf(b) && tagSeq(a) == tagSeq(b) && hasSeq(a) && hasSeq(b);
}

// Two collectives with different sequence numbers. Messages from one peer reach its matcher in
// the order the peer sent them (a tcp lane, a shm ring and a verbs queue pair each keep it), and a
// rank runs one collective at a time (collectives.h). So once a message of another collective
// arrives from a peer while a receive of this one waits, or waits in the unexpected queue when
// a receive of this one is posted and nothing of this one came before it, that receive's message
// will never come: the peer has left this collective, or never ran it. One of the two ranks ran a
// collective the other skipped; without this, both would wait out their timeouts.
bool otherSequence(uint64_t a, uint64_t b) {
  return tagSeq(a) != tagSeq(b) && hasSeq(a) && hasSeq(b);
}

// Same sequence number and collective, another signature: the ranks called it with different
// arguments. Found for any two of its messages, not only those with the same step: the rank
// that passed count 0 exchanges one empty message per peer at step 0 while the others run their
// algorithm's steps, and a rank's algorithm may never post a receive with the other's tag.
bool sameCollectiveOtherSignature(uint64_t a, const Signature& sa, uint64_t b,
                                  const Signature& sb) {
  return kindOf(a) == kindOf(b) && tagSeq(a) == tagSeq(b) && hasSeq(a) && hasSeq(b) && sa.known() &&
         sb.known() && sa != sb;
}

}  // namespace

std::string TagMatcher::sizeMismatch(size_t sent, size_t received, uint64_t tag) const {
  return detail::str("rank ", peer_, " sent ", sent, " bytes for ", describeTag(tag), " but rank ",
                     rank_, " receives ", received,
                     " bytes (ranks called the collective with different counts or dtypes)");
}

std::string TagMatcher::otherCollective(uint64_t sent, const Signature& sentSignature,
                                        uint64_t runs, const Signature& runsSignature) const {
  if (sentSignature.known() && runsSignature.known()) {
    return detail::str("mismatched collectives at #", tagSeq(runs), ": rank ", peer_, " called ",
                       describeSignature(sentSignature), " (its message ", describeTag(sent),
                       ") while rank ", rank_, " called ", describeSignature(runsSignature));
  }
  return detail::str("mismatched collectives: rank ", peer_, " sent ", describeTag(sent),
                     " while rank ", rank_, " runs ", describeTag(runs));
}

std::string TagMatcher::skippedCollective(uint64_t sent, const Signature& sentSignature,
                                          uint64_t runs, const Signature& runsSignature) const {
  const auto called = [](const Signature& s) {
    return s.known() ? detail::str(" (", describeSignature(s), ")") : std::string();
  };
  return detail::str("mismatched collectives: rank ", peer_, " sent ", describeTag(sent),
                     called(sentSignature), " while rank ", rank_, " waits for its message of ",
                     opTypeName(tagKind(runs)), "#", tagSeq(runs), called(runsSignature),
                     ", which it will not send (a rank's messages arrive in the order it sent "
                     "them): one of the two ranks skipped a collective the other ran");
}

std::string TagMatcher::signatureMismatch(const Signature& sent, const Signature& received,
                                          uint64_t tag) const {
  if (!sent.known() || !received.known() || sent == received) return {};
  return detail::str("mismatched collective #", tagSeq(tag), ": rank ", peer_, " called ",
                     describeSignature(sent), " while rank ", rank_, " called ",
                     describeSignature(received), " (found in the first message, ",
                     describeTag(tag), "; the ranks passed different arguments)");
}

std::string TagMatcher::disagreement(uint64_t sent, const Signature& sentSignature, uint64_t runs,
                                     const Signature& runsSignature) const {
  if (sameSeqOtherCollective(sent, runs)) {
    return otherCollective(sent, sentSignature, runs, runsSignature);
  }
  if (sameCollectiveOtherSignature(sent, sentSignature, runs, runsSignature)) {
    return signatureMismatch(sentSignature, runsSignature, sent);
  }
  if (otherSequence(sent, runs)) return skippedCollective(sent, sentSignature, runs, runsSignature);
  return {};
}

bool TagMatcher::arrive(uint64_t tag, size_t bytes, const Signature& signature,
                        std::string& error) {
  in_ = Incoming{};
  in_.active = true;
  in_.tag = tag;
  in_.bytes = bytes;
  in_.signature = signature;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->tag() != tag) continue;
    if (std::string m = signatureMismatch(signature, (*it)->signature(), tag); !m.empty()) {
      error = std::move(m);
      (*it)->fail(error, RequestCore::Failure::kInvalidArgument);
      posted_.erase(it);
      return false;
    }
    if ((*it)->bytes() != bytes) {
      error = sizeMismatch(bytes, (*it)->bytes(), tag);
      (*it)->fail(error, RequestCore::Failure::kInvalidArgument);
      posted_.erase(it);
      return false;
    }
    in_.request = std::move(*it);
    posted_.erase(it);
    in_.target = in_.request->data();
    return true;
  }
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (std::string m = disagreement(tag, signature, (*it)->tag(), (*it)->signature());
        !m.empty()) {
      // The ranks called different collectives, or the same one with different arguments: the
      // receive that was waiting for this sequence fails as the callers' mistake; the caller
      // fails the transport as a whole.
      error = std::move(m);
      (*it)->fail(error, RequestCore::Failure::kInvalidArgument);
      posted_.erase(it);
      return false;
    }
  }
  return false;
}

size_t TagMatcher::maxBufferBytes() {
  static const size_t limit = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    const size_t most = static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max());
    if (pages <= 0 || page <= 0) return most;
    const size_t phys = static_cast<size_t>(pages);
    const size_t pageBytes = static_cast<size_t>(page);
    return phys > most / pageBytes ? most : phys * pageBytes;
  }();
  return limit;
}

bool TagMatcher::bufferIncoming(std::string& error) {
  // The size is the sender's word: a message larger than this machine's memory (or a corrupt
  // header) is refused here with the sizes, not left to throw std::bad_alloc on a progress
  // thread or to be killed later by the OOM killer.
  std::unique_ptr<uint8_t[]> data;
  if (in_.bytes <= maxBufferBytes()) {
    data.reset(new (std::nothrow) uint8_t[std::max<size_t>(in_.bytes, 1)]);
  }
  if (!data) {
    error = detail::str(
        "rank ", peer_, " sent ", describeTag(in_.tag), " (", in_.bytes, " bytes) before rank ",
        rank_, " posted its receive, and rank ", rank_, " cannot buffer it: ",
        in_.bytes > maxBufferBytes()
            ? detail::str("it is larger than this machine's memory (", maxBufferBytes(), " bytes)")
            : std::string("out of memory"),
        " (post the receive before the peer sends, or send it in parts)");
    return false;
  }
  buffered_.fetch_add(in_.bytes, std::memory_order_relaxed);
  auto u = std::make_unique<UnexpectedMessage>();
  u->tag = in_.tag;
  u->bytes = in_.bytes;
  u->signature = in_.signature;
  u->data = std::move(data);
  in_.unexpected = u.get();
  in_.target = u->data.get();
  unexpected_.push_back(std::move(u));
  return true;
}

bool TagMatcher::finishIncoming() {
  bool completed = false;
  if (in_.request) {
    in_.request->complete();
    completed = true;
  } else if (in_.unexpected != nullptr) {
    in_.unexpected->complete = true;
  }
  in_ = Incoming{};
  return completed;
}

TagMatcher::Match TagMatcher::receive(const ReceivePtr& request, std::string& error) {
  const uint64_t tag = request->tag();
  const size_t bytes = request->bytes();
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    UnexpectedMessage& u = **it;
    if (u.tag != tag) continue;
    if (std::string m = signatureMismatch(u.signature, request->signature(), tag); !m.empty()) {
      error = std::move(m);
      request->fail(error, RequestCore::Failure::kInvalidArgument);
      return Match::kError;
    }
    if (u.bytes != bytes) {
      error = sizeMismatch(u.bytes, bytes, tag);
      request->fail(error, RequestCore::Failure::kInvalidArgument);
      return Match::kError;
    }
    if (u.complete) {
      if (bytes > 0) std::memcpy(request->data(), u.data.get(), bytes);
      unexpected_.erase(it);
      request->complete();
      return Match::kDone;
    }
    // Only the incoming message is incomplete (messages from one peer never interleave).
    LOOM_CHECK(in_.unexpected == &u, "rank ", rank_, ": an incomplete message from rank ", peer_,
               " that is not arriving");
    if (in_.got > 0) std::memcpy(request->data(), u.data.get(), in_.got);
    request->setBytesDone(in_.got);
    in_.unexpected = nullptr;
    in_.request = request;
    in_.target = request->data();
    unexpected_.erase(it);
    return Match::kArriving;
  }
  if (held()) {
    if (in_.tag == tag) {
      if (std::string m = signatureMismatch(in_.signature, request->signature(), tag); !m.empty()) {
        error = std::move(m);
        request->fail(error, RequestCore::Failure::kInvalidArgument);
        return Match::kError;
      }
      if (in_.bytes != bytes) {
        error = sizeMismatch(in_.bytes, bytes, tag);
        request->fail(error, RequestCore::Failure::kInvalidArgument);
        return Match::kError;
      }
      in_.request = request;
      in_.target = request->data();
      return Match::kArriving;
    }
    if (std::string m = disagreement(in_.tag, in_.signature, tag, request->signature());
        !m.empty()) {
      error = std::move(m);
      request->fail(error, RequestCore::Failure::kInvalidArgument);
      return Match::kError;
    }
  }
  for (const auto& u : unexpected_) {
    if (std::string m = disagreement(u->tag, u->signature, tag, request->signature()); !m.empty()) {
      error = std::move(m);
      request->fail(error, RequestCore::Failure::kInvalidArgument);
      return Match::kError;
    }
  }
  return Match::kNone;
}

void TagMatcher::failAll(const std::string& reason, bool nameTag, RequestCore::Failure kind) {
  auto failOne = [&](RequestCore& r) {
    r.fail(nameTag ? reason + describeTag(r.tag()) : reason, kind);
  };
  for (auto& r : posted_) failOne(*r);
  posted_.clear();
  if (in_.request) failOne(*in_.request);
  // Half a message never completes: a later receive must not wait for its rest.
  if (in_.unexpected != nullptr) {
    std::erase_if(unexpected_, [&](const auto& u) { return u.get() == in_.unexpected; });
  }
  in_ = Incoming{};
}

bool TagMatcher::hasUnexpected(uint64_t tag) const {
  for (const auto& u : unexpected_) {
    if (u->tag == tag) return true;
  }
  return held() && in_.tag == tag;
}

std::string TagMatcher::describeUnexpected() const {
  std::string out;
  size_t shown = 0;
  auto add = [&](uint64_t tag, size_t bytes) {
    if (shown++ == kShown) {
      out += ", ...";
      return false;
    }
    out += detail::str(out.empty() ? "" : ", ", describeTag(tag), " (", bytes, " bytes)");
    return true;
  };
  for (const auto& u : unexpected_) {
    if (!add(u->tag, u->bytes)) return out;
  }
  if (held()) add(in_.tag, in_.bytes);
  return out;
}

}  // namespace loom::comm
