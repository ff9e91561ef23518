// Window: memory that a Context's shared-memory collectives read straight out of its owner's
// process, one copy per byte and no kernel call per transfer (zero-copy windows).
//
// What it is
// - Window::allocate(bytes) maps `bytes` (rounded up to whole pages) of zeroed memory from an
//   anonymous memfd and registers the range in this process. Any buffer that lies inside a
//   live window may be passed to a collective like any other buffer.
// - When every rank of a shared-memory group passes window buffers to a large all-reduce,
//   reduce-scatter, broadcast or all-gather (at least ShmWindowMinBytes per rank, see
//   shm_single_copy.h), the group takes the window path: each rank publishes where its
//   buffers lie in its window, and the peers map that window once (opening the owner's memfd
//   through /proc/<pid>/fd, as the arena segment itself is shared, readable and writable) and
//   then read, and reduce from, the owner's memory directly; a broadcast's root also writes a
//   segment of each receiver's buffer when that spreads the copying over more cores. The
//   staged path copies every byte twice (into the arena, out of it); process_vm_readv copies
//   once but pins every page per call.
// - Symmetric use, as with NCCL's registered windows: for one collective, every rank passes
//   window buffers, or none does. A rank that does not gets an InvalidArgumentError naming
//   both ranks and what each passed, on every rank, instead of a hang or a wrong result.
// - A peer keeps its mapping of a window after the owner freed it (the memory goes back to
//   the system when the last mapping is gone); each rank keeps at most kPeerMappings per peer
//   and unmaps the least recently used one beyond that, and all of them when its Context ends.
// - Each window holds one file descriptor (its memfd, which peers open) for its lifetime:
//   carve many buffers out of a few large windows rather than making thousands of small ones.
// - The mapping is not inherited by fork() (MADV_DONTFORK, as registered RDMA memory): a
//   child that touches it faults, instead of silently sharing it with its parent.
//
// Errors: allocate() throws IoError when the memfd cannot be created, sized or its pages
// reserved (a full /dev/shm, RLIMIT_MEMLOCK does not apply), naming the bytes and errno, and
// InvalidArgumentError for 0 bytes.
//
// Thread-safety: allocate() and the destructor may run on any thread; the registry is guarded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace loom::comm {

class Window {
 public:
  static std::shared_ptr<Window> allocate(size_t bytes);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  void* data() const { return data_; }
  // The usable bytes (what was asked for, rounded up to whole pages).
  size_t size() const { return size_; }
  // Unique in this process for its lifetime; names the window to peers.
  uint64_t id() const { return id_; }

 private:
  Window(void* data, size_t size, int fd, uint64_t id)
      : data_(data), size_(size), fd_(fd), id_(id) {}

  void* data_;
  size_t size_;
  int fd_;
  uint64_t id_;
};

}  // namespace loom::comm
