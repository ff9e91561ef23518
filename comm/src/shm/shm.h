// The shared-memory fast path as the rest of comm/ sees it: Context::create makes an Arena
// when every rank of the Context is on this host (host identities compared through the Store)
// and shared memory is on (ContextOptions::sharedMemory and LOOM_SHM); collectives.cc asks
// for it with arenaFor() and runs the shm collectives (shm_collectives.h) when it gets one.
#pragma once

#include "loom/comm/collectives.h"
#include "shm/arena.h"

namespace loom::comm {
class Context;
}

namespace loom::comm::shm {

// The Context's arena, or null when its ranks are not all on one host or shm is off.
Arena* arenaOf(Context& ctx);

// arenaOf(ctx), or null when the caller forced a generic algorithm (opts.algorithm or a
// LOOM_ALGO other than "auto"/"shm"): forcing an algorithm means running it over the
// transport.
Arena* arenaFor(Context& ctx, const CollectiveOptions& opts);

}  // namespace loom::comm::shm
