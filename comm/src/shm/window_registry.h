// The process's registry of live Windows (loom/comm/window.h): which address ranges are
// window memory, and how a peer opens them.
#pragma once

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

}  // namespace loom::comm::shm
