// Arena: the shared-memory segment through which the ranks of one Context that live on one
// host run their collectives (the whole Context, or one host's ranks for the hierarchical
// all-reduce; docs/shm.md has the design and the measurements).
//
// What it is
// - One segment per Context (or host), created by rank 0 and shared so that nothing is left
//   behind whenever the job is SIGKILLed (an anonymous memfd; a named segment unlinked once
//   every rank mapped it where that is refused: segment.h). Threads-as-ranks map it too
//   (each its own mapping); same code path.
// - Layout: a header (abort flag, sleeper count), then per rank a control block (its counters,
//   its futex word, its pid) and `kSlots` staging slots of `slotBytes` each.
// - A collective is a sequence of *steps*; every rank runs the same steps in the same order
//   (that is the collectives' contract), so a step number k means the same thing on every rank.
//   Step k uses slot k % kSlots of each rank. Three monotonic stamps per rank say how far
//   it got: `posted` (its slot holds its data for step k: posted = k + 1; kept in the slot's
//   box, one cache line with the signature and up to kBoxBytes of data), `reduced` (it
//   finished the reduction phase of step k) and `consumed` (it no longer reads anybody's slot
//   for step k). A rank writes its slot for step k only once every rank consumed step
//   k - kSlots, so nobody reads a slot while it is overwritten.
// - Waiting: spin (up to 1 ms when every rank has a core and the awaited rank last ran on
//   another CPU; otherwise no timed spin, only 32 pauses before the first clock read when the
//   awaited rank last ran on another CPU), then sched_yield (up to 1 ms, 2 ms when ranks outnumber
//   cores), then FUTEX_WAIT on the awaited rank's futex word with a 20 ms timeout. Publishing
//   bumps the futex word and calls FUTEX_WAKE only when someone sleeps. Between futex waits
//   the waiter checks the deadline (TimeoutError naming the operation, its sequence number,
//   the rank waited for and the bytes outstanding), the group's abort flag, the local
//   transport's failure, and whether the awaited rank's process still lives (kill(pid, 0)
//   and /proc/<pid>/stat for zombies), so a dead peer turns into an IoError naming it within
//   tens of milliseconds.
// - Any failure sets the shared abort flag (naming the blamed rank and the reason) and wakes
//   every sleeper, so every rank of the group fails fast.
//
// - Single copy (cross-memory attach): at create every rank publishes its pid and the address
//   of a probe word through the store and reads every peer's word with process_vm_readv; only
//   when every rank read every peer's word is the group's single-copy path on (the answer is
//   agreed through the store, so all ranks choose alike; a rank with the path off turns it
//   off for all, and it runs at every size only when every rank forced it on). Large
//   collectives then publish
//   their user buffers' addresses in the control block and peers read them straight out of
//   the owner's memory (readPeer): one copy per byte instead of two (shm_single_copy.cc).
//   Where Yama restricts ptrace (scope 1), each rank names its readers for the probe (ptrace.h:
//   the one local peer, or the peers' nearest common ancestor; never any process of the user,
//   as Open MPI's vader does), keeps the name when the path is forced on, and otherwise
//   withdraws it after the probe and names them again the first time a collective publishes
//   its buffers for a cross-memory read (allowPeerReads).
// - Zero-copy windows (loom/comm/window.h): at create every rank also makes a one-page probe
//   Window and every peer maps it through /proc/<pid>/fd and reads its word; the answers are
//   agreed through the store as above. With the path on, a collective whose buffers lie in
//   Windows on every rank publishes each buffer's window (id, memfd number, base, size) beside
//   its address; a peer maps the window on first use (peerWindow), keeps at most
//   kPeerMappings per peer, and reads the owner's memory with plain loads. Every posted step
//   carries its access mode (staged, cross-memory, window), checked like the signature, so
//   ranks that disagree fail with an InvalidArgumentError instead of a hang.
//
// Thread-safety: one thread runs collectives on an Arena at a time (the Context's rule);
// abort() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/comm/context.h"
#include "loom/comm/tuning.h"
#include "shm/os.h"
#include "signature.h"

namespace loom {
class Store;
}

namespace loom::comm {
class Transport;
}

namespace loom::comm::shm {

class CopyHelpers;
class Segment;
struct WindowRef;

// How a collective's peers reach its data: through the arena's slots (staged, two copies),
// through process_vm_readv (one copy, the kernel pins pages), or through mapped Windows (one
// copy by plain loads).
enum class PeerAccess : uint32_t { kStaged = 0, kCrossMemory = 1, kWindow = 2 };
const char* peerAccessName(PeerAccess access);

struct ArenaOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string keyPrefix = "comm/shm";
  // Staging bytes per rank per slot; 0 = 2 MiB up to 4 ranks, 1 MiB beyond (large
  // collectives fill a whole slot per step, smaller ones use 256 KiB chunks; see
  // shm_collectives.h). ContextOptions::shmSlotBytes.
  size_t slotBytes = 0;
  // false skips the memfd (segment.h; ContextOptions::shmMemfd).
  bool memfd = true;
  // Wait budgets in µs, < 0 for waitBudget's defaults (os.h; ContextOptions::shmSpinUs/YieldUs).
  int spinUs = -1;
  int yieldUs = -1;
  // ContextOptions::shmSingleCopy (context.h).
  ShmSingleCopy singleCopy = ShmSingleCopy::kAuto;
  // ContextOptions::shmWindows: false never maps a peer's Window (and skips the probe).
  bool windows = true;
  // ContextOptions::shmWindowMinBytes (0: the measured defaults of shm_single_copy.cc).
  size_t windowMinBytes = 0;
  // ContextOptions::shmFoldSkew: true runs the folds skewed and rotated per rank (fold.h); false
  // (the default) block after block, every rank reading its peers in rank order.
  bool foldSkew = false;
  // ContextOptions::shmCopyThreads: helper threads per rank that share the staged all-reduce's
  // large copies and folds (copy_helpers.h); 0: none; < 0: auto (copyThreadsFor).
  int copyThreads = 0;
};

// The helper threads per rank for ArenaOptions::copyThreads `setting` (>= 0: that many, at most
// CopyHelpers::kMaxThreads; < 0, "auto": floor(cpus / localRanks) - 1 when that is >= 1, else 0).
int copyThreadsFor(int setting, int cpus, int localRanks);

// "boot id|hostname|net ns|ipc ns|mnt ns": equal strings mean the ranks can share a
// shm_open segment. The hostname alone is not enough (containers, network namespaces).
// `overrideId`, when not empty, replaces it (ContextOptions::shmHostId: tests use it to split
// one machine into "hosts").
std::string hostIdentity(const std::string& overrideId = {});

class Arena {
 public:
  static constexpr int kSlots = 2;
  // Bytes per rank that a step can carry in its announcement's cache line (Box) instead of
  // the slot: small steps then cost a waiter one cache-line transfer.
  static constexpr size_t kBoxBytes = 40;
  struct Box;  // arena_layout.h
  // Steps whose rooted-collective announcements each rank keeps (announceCall; >= 3 needed).
  static constexpr int kAnnouncements = 4;
  struct Announcement;  // arena_layout.h

  // Collective over the ranks: creates (rank 0) or maps the segment. Throws IoError when the
  // segment cannot be created or mapped and TimeoutError when a rank never arrives.
  static std::unique_ptr<Arena> create(Store& store, int rank, int size,
                                       const ArenaOptions& options);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  int rank() const { return rank_; }
  // Whether the folds run skewed and rotated (fold.h; ArenaOptions::foldSkew).
  bool foldSkew() const { return foldSkew_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  // "memfd:<pid>:<fd>", or the POSIX name when the memfd could not be shared (segment.h).
  const std::string& segmentName() const;

  // Whether the single-copy path is usable (the probe agreed on every rank), and whether it
  // was forced on for every size. Equal on every rank of the group.
  bool singleCopy() const { return singleCopy_; }
  bool singleCopyForced() const { return singleCopyForced_; }
  // Why the single-copy path is off ("" when on).
  const std::string& singleCopyFailure() const { return singleCopyFailure_; }
  // The per-operation sizes that take the single copy when it is usable but not forced (a
  // tuning file's OP.cma_min / OP.cma_max, loom/comm/tuning.h; none by default). Set once by
  // the Context before its first collective, alike on every rank (every rank reads the same
  // file; a rank that disagrees fails the collective naming both paths).
  void setCrossMemoryRanges(const Crossovers& crossovers) { crossMemory_ = crossovers; }
  // Whether a collective of `kind` moving `bytes` per rank takes the single copy.
  bool crossMemoryFor(OpType kind, size_t bytes) const {
    if (!singleCopy_) return false;
    if (singleCopyForced_) return true;
    switch (kind) {
      case OpType::kAllreduce:
        return crossMemory_.allreduceCma.contains(bytes);
      case OpType::kBroadcast:
        return crossMemory_.broadcastCma.contains(bytes);
      case OpType::kAllgather:
        return crossMemory_.allgatherCma.contains(bytes);
      case OpType::kReduceScatter:
        return crossMemory_.reduceScatterCma.contains(bytes);
      default:
        return false;
    }
  }

  // Whether peers' Windows can be mapped (the probe agreed on every rank; equal on every rank),
  // and why not ("" when they can).
  bool windows() const { return windows_; }
  const std::string& windowsFailure() const { return windowsFailure_; }
  // ArenaOptions::windowMinBytes (0: the measured defaults), and whether the host's ranks
  // outnumber the CPUs this process may run on (the defaults differ).
  size_t windowMinBytes() const { return windowMinBytes_; }
  bool oversubscribed() const { return oversubscribed_; }
  // The CPUs this process may run on (sched_getaffinity), seen at setup.
  int cpus() const { return cpus_; }

  // The transport to poll for local failure (Context::abort) while waiting; may be null.
  void setTransport(Transport* transport) { transport_ = transport; }

  // Marks the whole group failed (first reason wins) and wakes every waiter.
  // `invalid`: the ranks' calls disagree, so every rank's error is InvalidArgumentError.
  void abort(int blamedRank, const std::string& reason, bool invalid = false);

  // ---- used by the shm collectives (shm_collectives.cc) ----

  // The state of one running collective: its name for messages and its deadline.
  struct Call {
    // The deadline is armed by the first wait that does not find its counter ready (at the
    // clock read that wait makes anyway), not when the call starts: a small collective whose
    // peers are already there reads no clock at all (a read is ~25 ns, 5% of an 8-byte
    // all-reduce). The time before that first wait is this rank's own work, never a wait.
    mutable int64_t deadlineNs = 0;  // nowNs() + timeout; 0: not armed
    std::chrono::milliseconds timeout;
    size_t bytes;         // per rank, for messages
    Signature signature;  // kind/count/dtype/op/root: must match on every rank
    uint32_t kind;        // OpType, for mismatch messages
    uint64_t seq;
    mutable size_t done = 0;  // bytes of this rank's part finished, for timeout messages
    // How peers reach this step's data: the same on every rank (checked by waitPosted).
    PeerAccess access = PeerAccess::kStaged;
    // An algorithm variant the rank that posts chooses alone and its peers follow (read with
    // postedVariant after waitPosted): 1 = the root helps copy a window broadcast.
    mutable uint32_t variant = 0;
    std::string name() const;  // "allreduce#17", built only for messages
  };

  // Arms the call's deadline at `now` (nowNs()) unless armed; returns the nanoseconds left.
  static int64_t armDeadline(const Call& call, int64_t now);

  // Throws the error of the group's abort (the flag is set): InvalidArgumentError for a
  // mismatch, IoError otherwise.
  [[noreturn]] void throwAborted(const Call& call);
  // Throws IoError when the group already failed or the Context was aborted.
  void checkUsable(const Call& call);

  uint64_t step() const { return step_; }
  int slotOf(uint64_t step) const { return static_cast<int>(step % kSlots); }
  uint8_t* slot(int rank, uint64_t step) { return slots_[rank] + slotOf(step) * slotBytes_; }
  // `rank`'s box for the current step (kBoxBytes, 8-byte aligned): written before post(),
  // read by peers after waitPosted(), under the same rules as the slot.
  uint8_t* box(int rank) { return boxes_[slotOf(step_) * size_ + rank]; }
  // Where `rank` stages `bytes` for the current step: its box when they fit, its slot
  // otherwise. Every rank of a step passes the same `bytes` (the signature guarantees it).
  uint8_t* staging(int rank, size_t bytes) {
    return bytes <= kBoxBytes ? box(rank) : slot(rank, step_);
  }

  // Before writing this rank's slot or box for the current step: waits until every rank
  // consumed the step that last used them: it posted the step after that one (a rank posts
  // step N only after finishStep of N - 1, and every collective posts before it waits on
  // another rank's progress in the same step, so that post always comes), or its consumed
  // counter says so (ranks that do not post in every step: the rooted collectives).
  void acquireSlot(const Call& call);
  // The rooted collectives' check of each other's calls (broadcast, scatter, gather; their
  // count-0 step too), in which not every rank reads every rank's post. At the first step,
  // before it posts or waits for anything, every rank announces its call (signature and access
  // mode) for the step; before it returns it has compared every peer's announcement, or the
  // peer's post of the step, with its own call, so ranks that passed different roots (or
  // counts, dtypes, paths) all fail with an InvalidArgumentError instead of each running its own
  // collective. Why this is complete, and its cost: arena.cc (announceCall).
  void announceCall(const Call& call);
  // Waits until `peer` announced or posted the current step and compares its call with this
  // rank's; a rank that posted without announcing runs no rooted collective here: a mismatch.
  void checkAnnounced(const Call& call, int peer);
  // checkAnnounced for every peer but `skip` (one already checked; -1: none).
  void checkAnnouncedAll(const Call& call, int skip = -1);
  // Publishes this rank's slot and box (and the call's signature) for the current step.
  void post(const Call& call);
  // Waits until `peer` posted the current step and checks its signature.
  // After `peer` posted the current step: fails the group when its signature or access mode
  // differs from `call`'s.
  void checkPostedBox(const Call& call, int peer);
  void waitPosted(const Call& call, int peer);
  void waitPostedAll(const Call& call);
  // The Call::variant `peer` posted the current step with (after waitPosted).
  uint32_t postedVariant(int peer) const;
  void markReduced();
  void waitReduced(const Call& call, int peer);
  void waitReducedAll(const Call& call);
  // Ends the current step on this rank (it no longer reads other slots) and moves on.
  // `announce` false skips publishing the consumed counter (a store to the line the peers
  // poll, and a locked add): for a step that no rank waits on with waitFinishedAll and whose
  // slot acquireSlot then sees free through this rank's next post. The small all-reduce and
  // the barrier, where every rank waits for every post of the step anyway.
  void finishStep(bool announce = true);
  // After finishStep: waits until every peer finished the step just ended (it no longer reads
  // this rank's buffers).
  void waitFinishedAll(const Call& call);

  // ---- the single-copy path (shm_single_copy.cc) ----

  // Publishes the addresses of this rank's user buffers for the current step (before post),
  // with the Windows that hold them on the window path (null otherwise).
  void publishBuffers(const void* in, const void* out, const WindowRef* inWindow = nullptr,
                      const WindowRef* outWindow = nullptr);
  // Under Yama scope 1, names this rank's readers again (ptrace.h) if the probe withdrew the
  // name: called by publishBuffers before the first cross-memory step. Idempotent.
  void allowPeerReads();
  // `peer`'s published buffer for the current step (after waitPosted): 0 = in, 1 = out.
  uint64_t peerBuffer(int peer, int which) const;
  // Copies `bytes` from address `remote` of `peer`'s process into `local` (process_vm_readv).
  // A failure (the peer died, permission withdrawn, a bad address) fails the group with an
  // IoError naming the peer, the bytes and the errno text; it never returns partial data.
  void readPeer(const Call& call, int peer, uint64_t remote, void* local, size_t bytes);
  // On the window path (after waitPosted): `peer`'s published buffer `which` as a pointer in
  // this process, its Window mapped on first use. A window that cannot be mapped fails the
  // group with an IoError naming the peer and why.
  const uint8_t* peerWindow(const Call& call, int peer, int which) {
    return peerWindowForWrite(call, peer, which);
  }
  // The same, writable: only where the collective's steps give this rank that part of the
  // peer's output (the window all-reduce's owner of a segment, the assisted broadcast's root).
  uint8_t* peerWindowForWrite(const Call& call, int peer, int which);
  // Copies `bytes` at byte `offset` of `peer`'s published buffer `which` into `local`: plain
  // memcpy on the window path (non-temporal stores with `stream`: then fenceStreams() before
  // the data is announced, stream_copy.h), readPeer otherwise.
  void copyFromPeer(const Call& call, int peer, int which, size_t offset, void* local, size_t bytes,
                    bool stream = false);
  // Mapped peer Windows kept per peer (least recently used unmapped beyond).
  static constexpr size_t kPeerMappings = 16;
  // Scratch of kBounceBytes, 64-byte aligned, for reductions of peers' data.
  static constexpr size_t kBounceBytes = 256 << 10;
  uint8_t* bounce();

  // ---- helper threads (copy_helpers.h; docs/shm.md "Helper threads") ----

  // Steps of at least this many bytes per rank may share their copies and folds with helper
  // threads; each thread gets at least kHelperMinPartBytes of the range.
  static constexpr size_t kHelperMinStepBytes = 256 << 10;
  static constexpr size_t kHelperMinPartBytes = 64 << 10;
  // Parts stop to check partsStopped() after at most this many bytes.
  static constexpr size_t kPartRunBytes = 128 << 10;
  // The helper threads this rank uses (ArenaOptions::copyThreads resolved at create).
  int copyThreads() const { return copyThreads_; }
  // The helper threads started so far (0 until the first step that uses them; tests).
  int helperThreadsRunning() const;
  // How many threads (this one included) share a range that moves `bytes`: 1 without helpers,
  // else up to copyThreads() + 1, each with at least kHelperMinPartBytes.
  int partsFor(size_t bytes) const;
  // Runs part(i, parts) for i in [0, parts): part 0 on this thread, the others on the helpers
  // (started on first use), and returns once every part returned. A part returns false when it
  // stopped early because partsStopped() said so; then, and when the call's deadline passes
  // while it waits, this throws the group's error (IoError / InvalidArgumentError) or a
  // TimeoutError, but only after every part returned. The parts must not throw and must not
  // wait for peers.
  template <class Part>
  void parallel(const Call& call, int parts, Part&& part) {
    using P = std::remove_reference_t<Part>;
    runParallel(
        call, parts, [](void* context, int i, int n) { return (*static_cast<P*>(context))(i, n); },
        const_cast<void*>(static_cast<const void*>(&part)));
  }
  // Whether parts should stop at their next check: the group failed, or this call's wait for
  // the helpers passed its deadline.
  bool partsStopped() const;

  // Throws the group's failure as IoError (or TimeoutError) after aborting.
  [[noreturn]] void fail(const Call& call, int blamedRank, const std::string& what, bool timeout);
  // As fail(), for ranks whose calls disagree (a caller's mistake): InvalidArgumentError.
  [[noreturn]] void failMismatch(const Call& call, int peer, const std::string& what);

 private:
  struct Header;
  struct Control;

  Arena(int rank, int size, size_t slotBytes, WaitBudget budget, std::unique_ptr<Segment> segment);
  // The setup probe of the single-copy path (see the file comment); sets singleCopy_.
  void probeSingleCopy(Store& store, const ArenaOptions& options);
  // The setup probe of the window path; sets windows_.
  void probeWindows(Store& store, const ArenaOptions& options);

  Control& control(int rank) const { return *controls_[rank]; }
  // Fails the group with an InvalidArgumentError naming both calls' signatures.
  [[noreturn]] void failSignature(const Call& call, int peer, const std::string& theirCall,
                                  const Signature& theirs);
  // The same for the access mode (staged, cross-memory, window).
  [[noreturn]] void failAccess(const Call& call, int peer, PeerAccess theirs);
  // Waits until `value` (one of `peer`'s counters or box stamps) >= target; `what` names the
  // phase for messages. `alt` non-null: also done once *alt reaches `altTarget`.
  void waitFor(const Call& call, int peer, const std::atomic<uint64_t>& value, uint64_t target,
               const char* what, const std::atomic<uint64_t>* alt = nullptr,
               uint64_t altTarget = 0);
  // Stores this rank's counter and announces it (announce()).
  void publish(int counter, uint64_t value);
  // After a store that peers may wait for: records this CPU, bumps the futex word and wakes
  // sleepers, if any.
  void announce();
  // Throws when the group failed, `peer` died or closed its context, or the deadline passed.
  // When `counter` is given, a peer that is gone but had already published `target` (or `alt`
  // reached `altTarget`: waitFor's alternative) is not a failure: returns false ("the data is
  // there") instead; true means keep waiting.
  bool checkHealth(const Call& call, int peer, const char* what,
                   const std::atomic<uint64_t>* counter = nullptr, uint64_t target = 0,
                   const std::atomic<uint64_t>* alt = nullptr, uint64_t altTarget = 0);
  std::string transportFailure() const;
  void runParallel(const Call& call, int parts, bool (*part)(void*, int, int), void* context);

  const int rank_;
  const int size_;
  const size_t slotBytes_;
  std::unique_ptr<Segment> segment_;
  void* base_;
  Header* header_;
  std::vector<Control*> controls_;  // per rank
  std::vector<uint8_t*> slots_;     // per rank: its first slot
  std::vector<uint8_t*> boxes_;     // per slot, per rank: the box's data
  uint64_t step_ = 0;
  bool foldSkew_ = false;  // set once in create()
  const int64_t spinNs_;   // waitBudget (os.h), or ArenaOptions::spinUs
  const int64_t yieldNs_;  // or ArenaOptions::yieldUs
  Transport* transport_ = nullptr;
  bool singleCopy_ = false;
  bool singleCopyForced_ = false;
  Crossovers crossMemory_;  // only its *Cma ranges are used
  std::string singleCopyFailure_;
  uint64_t probeWord_ = 0;         // read by the peers' probes
  std::vector<pid_t> readerPids_;  // every rank's pid (the probe's), for allowPeerReads
  bool ptracerNeeded_ = false;     // Yama's ptrace_scope is 1 (read once, by the probe)
  int readGrant_ = 0;              // ptrace.h's grant: PR_SET_PTRACER covers them now
  bool windows_ = false;
  size_t windowMinBytes_ = 0;
  bool oversubscribed_ = false;
  int cpus_ = 1;
  std::string windowsFailure_;
  // Peers' Windows mapped here (window path), per peer.
  struct Mapping {
    uint64_t id;
    uint8_t* local;
    size_t bytes;
    uint64_t lastUse;
  };
  std::vector<std::vector<Mapping>> mappings_;
  uint64_t useClock_ = 0;
  std::unique_ptr<uint8_t[], void (*)(void*)> bounce_{nullptr, nullptr};
  int copyThreads_ = 0;       // set once in create()
  int64_t helperSpinNs_ = 0;  // how long idle helpers spin (0 unless every thread has a CPU)
  // Last: destroyed (stopped and joined) before anything above, though ~Arena resets it first.
  std::unique_ptr<CopyHelpers> helpers_;
};

}  // namespace loom::comm::shm
