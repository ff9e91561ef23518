// Zeroed float memory for the buffers DDP and ZeRO-1 hand to collectives: a Loom Window where
// asked (comm/window.h: same-host peers read and write it in place, so the shared-memory
// collectives take their zero-copy window path), else an ordinary array.
#pragma once

#include <cstddef>
#include <memory>

namespace loom::ddp {

// `count` zeroed floats, kept alive by the pointer. `window`: in a Window. A window that cannot
// be made (no memfd here) gives ordinary memory and one warning per process (naming `what`): the
// arena's setup probe, which makes a window on every rank, then failed too, so no rank of the
// group takes the window path and the ranks still agree.
std::shared_ptr<float> allocateFloats(size_t count, bool window, const char* what);

}  // namespace loom::ddp
