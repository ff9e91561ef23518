// The process's registry of live Windows (loom/comm/window.h): which address ranges are
// window memory, and how a peer opens them.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace loom::comm::shm {

// Where a buffer lies: the window holding it (id, the owner's memfd number, the window's base
// address and size in the owner's process).
struct WindowRef {
  uint64_t id = 0;  // 0: not in a window
  int32_t fd = -1;
  uint64_t base = 0;
  uint64_t bytes = 0;
};

// The live window that holds [p, p + bytes), or nullopt (also for bytes == 0 outside one).
std::optional<WindowRef> findWindow(const void* p, size_t bytes);

// The memfd name of window `id` ("loom-window-<id>"): a peer checks it through /proc before it
// maps the descriptor, so that a reused descriptor number is never mistaken for the window.
std::string windowMemfdName(uint64_t id);

// Maps window `ref` of process `pid` (this process too) for reading and writing (a broadcast's
// root writes part of each receiver's buffer, shm_single_copy.cc), after checking that
// /proc/<pid>/fd/<fd> names that window's memfd; nullptr and `why` (the path and the reason)
// when it cannot. The caller munmaps ref.bytes.
uint8_t* mapPeerWindow(pid_t pid, const WindowRef& ref, std::string& why);

}  // namespace loom::comm::shm
