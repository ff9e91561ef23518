// Comparing the ranks' calls on the arena: what a mismatch says (a peer's posted signature or
// access mode differs), and the rooted collectives' announcements, through which every rank
// compares every peer's call before it returns (the hot path's inline compare is in
// Arena::waitPosted, arena.cc).
#include "loom/common/error.h"
#include "loom/common/schedule_noise.h"
#include "shm/arena.h"
#include "shm/arena_layout.h"
#include "signature.h"
#include "tag.h"

namespace loom::comm::shm {

namespace {
constexpr const char* kAnnounceWhat = "start the collective";
}  // namespace

void Arena::failSignature(const Call& call, int peer, const std::string& theirCall,
                          const Signature& theirs) {
  failMismatch(call, peer,
               detail::str("mismatched collectives: rank ", rank_, " is in ", call.name(), " (",
                           call.bytes, " bytes): ", describeSignature(call.signature), ", rank ",
                           peer, " in ", theirCall, ": ", describeSignature(theirs),
                           "; the ranks called different collectives or passed different "
                           "arguments (count, dtype, op or root)"));
}

void Arena::failAccess(const Call& call, int peer, PeerAccess theirs) {
  failMismatch(call, peer,
               detail::str("rank ", rank_, " takes the ", peerAccessName(call.access),
                           " path and rank ", peer, " the ", peerAccessName(theirs),
                           " path for the same collective; every rank must pass buffers inside "
                           "Loom Windows (loom/comm/window.h), or none"));
}

void Arena::checkPostedBox(const Call& call, int peer) {
  const Control& theirs = control(peer);
  const int s = slotOf(step_);
  const Box& box = theirs.box[s];
  if (box.signature != call.signature.word ||
      box.signatureExtra != static_cast<uint32_t>(call.signature.extra)) {
    failSignature(call, peer,
                  detail::str(opTypeName(static_cast<OpType>(theirs.postedKind[s])), "#",
                              theirs.postedSeq[s], " (", theirs.postedBytes[s], " bytes)"),
                  Signature{box.signature, box.signatureExtra});
  }
  if (box.access != static_cast<uint16_t>(call.access)) {
    failAccess(call, peer, static_cast<PeerAccess>(box.access));
  }
}

// Why the rooted collectives need this. In a broadcast or scatter only the root posts and only
// the others wait (for the root's post, whose signature they compare); in a gather only the
// others post and only the root waits. The signature, root included, was compared only by a
// rank that waits for a post, so ranks that each believed themselves the root compared nothing:
// broadcast with roots [0, 1] returned on both ranks with different data, [0, 0, 2, 2] ran two
// broadcasts, and [1, 0] or a gather of two "roots" waited out the deadline.
//
// Now, at the collective's first step, every rank announces its call before it posts or waits
// for anything, and compares every peer's call with its own before it returns: the peer's post
// of the step when it is there (the box holds the signature and the access mode), else its
// announcement. Complete, whatever each rank passed: if the calls are not all equal, every rank
// r has some peer whose call differs from r's, and r compares that peer's call before it
// returns, so every rank throws InvalidArgumentError naming two calls that differ, found by
// itself (or earlier, through the group's abort, by another rank that found it first), and none
// returns. No rank can wait forever before it compares: a receiver of a broadcast or scatter
// compares its root's call before it waits for the root's post (so [1, 0], where nobody believes
// it is the root, fails at once), a rank whose root's call equals its own waits for a root that
// posts unconditionally, and a gather's root compares every call before it waits for the posts.
// A peer that posted the step without announcing it runs no rooted collective there (a rooted
// collective announces before it posts): a mismatch too, found at once instead of at the
// deadline. When every call agrees, every check passes and the collective runs as before.
//
// Cost: the root posts before it compares, so its receivers get the data as early as before,
// and the root then waits until every rank arrived at this call, which its next post would have
// waited for anyway (acquireSlot: every rank finished the step before), so a root still runs one
// step ahead of its receivers. A receiver reads its root's announcement only when the root has
// not posted yet, and from 3 ranks waits, after its copy, until the other receivers arrived too.
// Measured in docs/shm.md.
//
// The ring of kAnnouncements entries: this rank overwrites the entry of step k - 4 when it starts
// step k, after it finished step k - 1. Every rank's every step ends after an acquireSlot of that
// step (on the rank, or on the rank whose post it waits for: a post of step j waits until every
// rank finished step j - 2) or after every rank's announcement of it; so once step k - 1 ended
// here every rank finished step k - 3 and read its announcements of step k - 4 and before (3
// entries would do; 4 keeps the index a mask).
void Arena::announceCall(const Call& call) {
  LOOM_NOISE();  // a late rank: its peers already wait for this announcement
  Announcement& mine = control(rank_).announced[step_ % kAnnouncements];
  mine.signature = call.signature.word;
  mine.signatureExtra = static_cast<uint32_t>(call.signature.extra);
  mine.seq = call.seq;
  mine.access = static_cast<uint16_t>(call.access);
  mine.kind = static_cast<uint8_t>(call.kind);
  mine.stamp.store(step_ + 1, std::memory_order_release);
  announce();
}

void Arena::checkAnnouncedAll(const Call& call, int skip) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && q != skip) checkAnnounced(call, q);
  }
}

void Arena::checkAnnounced(const Call& call, int peer) {
  const Control& theirs = control(peer);
  const Announcement& a = theirs.announced[step_ % kAnnouncements];
  const int s = slotOf(step_);
  const Box& box = theirs.box[s];
  waitFor(call, peer, box.posted, step_ + 1, kAnnounceWhat, &a.stamp, step_ + 1);
  // Its post, when there, says as much as its announcement (an unrooted collective's post too).
  if (box.posted.load(std::memory_order_acquire) >= step_ + 1) {
    checkPostedBox(call, peer);
    return;
  }
  if (a.signature != call.signature.word ||
      a.signatureExtra != static_cast<uint32_t>(call.signature.extra)) {
    failSignature(call, peer, detail::str(opTypeName(static_cast<OpType>(a.kind)), "#", a.seq),
                  Signature{a.signature, a.signatureExtra});
  }
  if (a.access != static_cast<uint16_t>(call.access)) {
    failAccess(call, peer, static_cast<PeerAccess>(a.access));
  }
}

}  // namespace loom::comm::shm
