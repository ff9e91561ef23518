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
// - When some rank could not open it (no /proc, or ptrace-style access refused), every rank
//   drops it and the group falls back to a named POSIX segment (shm_open,
//   "/loom-shm-<pid>-<random>"): rank 0 creates it, publishes the name, every rank maps it
//   and says so, and rank 0 unlinks the name once all did (also when that wait fails). Only
//   this fallback can leak, and only if rank 0 is killed between creating the name and the
//   last rank mapping it.
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
};

}  // namespace loom::comm::shm
