// Segment: one block of memory shared by the ranks of one host, created collectively through
// the Store. The arena (collectives) and the shared-memory transport (point-to-point) each
// live in one.
//
// How it is shared without leaking
// - Rank 0 creates an anonymous memfd (no name anywhere in the file system), sizes and
//   reserves it (posix_fallocate: a full tmpfs is an IoError here, never a SIGBUS later),
//   maps it, lets `init` write the header, and publishes "memfd:<pid>:<fd>" in the Store.
//   Every other rank opens /proc/<pid>/fd/<fd> (a new open of the same memory; allowed
//   between processes of one user, and within one process for thread ranks), maps it and
//   says "ok" or why not. Every rank waits for every answer, so all take the same decision:
//   when all could open it, that is the segment, and rank 0 closes its fd. Nothing ever has a
//   name, so a SIGKILLed job, at any moment, even inside create, leaves nothing behind.
// - A rank that maps the memory but finds another layout (ranks with different
//   LOOM_SHM_SLOT_BYTES or LOOM_SHM_RING_BYTES) says so, and every rank fails with `check`'s
//   message, which names the settings to compare; no fallback (it would not cure that).
// - When some rank could not open it (no /proc, or ptrace-style access refused), every rank
//   drops it and the group falls back to a named POSIX segment (shm_open,
//   "/loom-shm-<pid>-<random>"): rank 0 creates it and publishes the name without waiting;
//   each other rank opens it, counts itself in the store, and the last to open unlinks the
//   name. Rank 0 also unlinks it when its setup fails afterwards (the Segment owns the name
//   until then). Only this fallback can leak: when rank 0 is killed, or another rank dies,
//   before the last rank opened it. What leaked is removed by the next named segment made on
//   the host (sweepStaleNamedSegments): a name whose creator's pid is gone and that is older
//   than an hour, so that no setup still under way (its peers may take the setup timeout to
//   come) can lose its name, even one whose creator lives in another pid namespace.
//
// Thread-safety: create is a collective call; the Segment is then plain memory.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace loom {
class Store;
}

namespace loom::comm::shm {

// Removes /dev/shm/loom-shm-<pid>-* whose pid is no process (kill says ESRCH) and that are at
// least `minAge` old; logs a warning for each; returns how many it removed.
int sweepStaleNamedSegments(std::chrono::seconds minAge);
inline constexpr std::chrono::seconds kStaleNamedSegmentAge{3600};

class Segment {
 public:
  // Called on rank 0 with the zeroed memory before any other rank can see it.
  using Init = std::function<void(void* base, size_t bytes)>;
  // Called on the other ranks after mapping; throws IoError when the memory does not match.
  using Check = std::function<void(const void* base, size_t bytes)>;

  // Collective over ranks 0..size-1 (rank numbers of this segment, not of the Context). Keys
  // are "<keyPrefix>/...". Throws IoError when the memory cannot be created or mapped and
  // TimeoutError when a rank never arrives within `timeout`. `memfd` false skips the memfd
  // (ContextOptions::shmMemfd).
  static std::unique_ptr<Segment> create(Store& store, int rank, int size, size_t bytes,
                                         const std::string& keyPrefix,
                                         std::chrono::milliseconds timeout, const Init& init,
                                         const Check& check, bool memfd = true);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // "memfd:<pid>:<fd>" or the POSIX name ("/loom-shm-..."), for messages and tests.
  const std::string& name() const { return name_; }
  bool named() const { return !name_.empty() && name_[0] == '/'; }

 private:
  Segment(void* base, size_t bytes, std::string name)
      : base_(base), bytes_(bytes), name_(std::move(name)) {}

  void* base_;
  size_t bytes_;
  std::string name_;
  bool unlinkOnDestroy_ = false;  // rank 0 of a named segment, while the name may exist
};

}  // namespace loom::comm::shm
