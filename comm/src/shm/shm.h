// The shared-memory fast path as the rest of comm/ sees it: Context::create makes an Arena
// when every rank of the Context is on this host (host identities compared through the Store)
// and shared memory is on (ContextOptions::sharedMemory and LOOM_SHM), and hands it to the
// arena engine (engine/engines.h), which runs the shm collectives (shm_collectives.h).
#pragma once

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"
#include "shm/arena.h"

namespace loom::comm {
class Context;
}

namespace loom::comm::shm {

// The Context's arena (its arena engine's), or null when its ranks are not all on one host or
// shm is off; for tests and diagnostics (engine/shm_engines.cc).
Arena* arenaOf(Context& ctx);

// The arena that runs a collective of `type` with `opts` on `ctx`: its arena engine's, when the
// Context's engines pick that engine for such a call (no algorithm forced), else null.
Arena* arenaFor(Context& ctx, OpType type, const CollectiveOptions& opts);

}  // namespace loom::comm::shm
