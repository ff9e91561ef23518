// The shared-memory fast path as the rest of comm/ sees it: Context::create makes an Arena
// when every rank of the Context is on this host (host identities compared through the Store)
// and shared memory is on (ContextOptions::sharedMemory and LOOM_SHM), and hands it to the
// arena engine (engine/engines.h), which runs the shm collectives (shm_collectives.h).
#pragma once

#include "shm/arena.h"

namespace loom::comm {
class Context;
}

namespace loom::comm::shm {

// The Context's arena (its arena engine's), or null when its ranks are not all on one host or
// shm is off; for tests and diagnostics (engine/shm_engines.cc).
Arena* arenaOf(Context& ctx);

}  // namespace loom::comm::shm
