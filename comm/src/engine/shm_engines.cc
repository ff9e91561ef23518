// The two shared-memory engines: the arena engine runs every collective through the Context's
// arena (all ranks on this host); the hierarchical engine runs the all-reduce through each
// host's arena and the transport between the hosts' leaders (shm/hierarchy.h).
#include <utility>

#include "engine/engines.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "shm/arena.h"
#include "shm/shm.h"
#include "shm/shm_collectives.h"

namespace loom::comm {

namespace {

class ArenaEngine final : public Engine {
 public:
  explicit ArenaEngine(std::unique_ptr<shm::Arena> arena)
      : Engine(Kind::kArena, kAllCollectives), arena_(std::move(arena)) {}

  shm::Arena& arena() { return *arena_; }

  void run(const CollectiveCall& c) override {
    shm::Arena& a = *arena_;
    switch (c.type) {
      case OpType::kAllreduce:
        return shm::allreduce(a, c.opts, c.in, c.out, c.count, c.dtype, c.op);
      case OpType::kBroadcast:
        return shm::broadcast(a, c.opts, c.out, c.count, c.dtype, c.root);
      case OpType::kReduce:
        return shm::reduce(a, c.opts, c.in, c.out, c.count, c.dtype, c.op, c.root);
      case OpType::kAllgather:
        return shm::allgather(a, c.opts, c.in, c.out, c.count, c.dtype);
      case OpType::kReduceScatter:
        return shm::reduceScatter(a, c.opts, c.in, c.out, c.count, c.dtype, c.op);
      case OpType::kGather:
        return shm::gather(a, c.opts, c.in, c.out, c.count, c.dtype, c.root);
      case OpType::kScatter:
        return shm::scatter(a, c.opts, c.in, c.out, c.count, c.dtype, c.root);
      case OpType::kAlltoall:
        return shm::alltoall(a, c.opts, c.in, c.out, c.count, c.dtype);
      case OpType::kBarrier:
        return shm::barrier(a, c.opts);
      default:
        LOOM_THROW(InvalidArgumentError, "the arena engine got ", opTypeName(c.type));
    }
  }

  void abort(int rank, const std::string& reason) override { arena_->abort(rank, reason); }

 private:
  std::unique_ptr<shm::Arena> arena_;
};

class HierarchicalEngine final : public Engine {
 public:
  HierarchicalEngine(shm::Hierarchy hierarchy, std::unique_ptr<shm::Arena> hostArena)
      : Engine(Kind::kHierarchical, opBit(OpType::kAllreduce)),
        hierarchy_(std::move(hierarchy)),
        hostArena_(std::move(hostArena)) {
    hierarchy_.arena = hostArena_.get();
  }

  const shm::Hierarchy& hierarchy() const { return hierarchy_; }

  void run(const CollectiveCall& c) override {
    shm::hierarchicalAllreduce(c.ctx, hierarchy_, c.opts, c.in, c.out, c.count, c.dtype, c.op);
  }

  void abort(int rank, const std::string& reason) override {
    if (hostArena_ != nullptr) hostArena_->abort(rank, reason);
  }

 private:
  shm::Hierarchy hierarchy_;
  std::unique_ptr<shm::Arena> hostArena_;
};

// The Context's local engine when it is of `kind`, else null.
Engine* localEngine(Context& ctx, Engine::Kind kind) {
  const EngineSet* engines = ctx.engines();
  Engine* local = engines != nullptr ? engines->local() : nullptr;
  return local != nullptr && local->kind() == kind ? local : nullptr;
}

}  // namespace

std::unique_ptr<Engine> makeArenaEngine(std::unique_ptr<shm::Arena> arena) {
  return std::make_unique<ArenaEngine>(std::move(arena));
}

std::unique_ptr<Engine> makeHierarchicalEngine(shm::Hierarchy hierarchy,
                                               std::unique_ptr<shm::Arena> hostArena) {
  return std::make_unique<HierarchicalEngine>(std::move(hierarchy), std::move(hostArena));
}

namespace shm {

// The kind tag is the type check: only ArenaEngine says kArena, only HierarchicalEngine
// says kHierarchical.
Arena* arenaOf(Context& ctx) {
  Engine* e = localEngine(ctx, Engine::Kind::kArena);
  return e != nullptr ? &static_cast<ArenaEngine*>(e)->arena() : nullptr;
}

Arena* arenaFor(Context& ctx, OpType type, const CollectiveOptions& opts) {
  const EngineSet* engines = ctx.engines();
  if (engines == nullptr) return nullptr;
  const CollectiveCall call{ctx, opts, type};
  Engine& e = engines->engineFor(call);
  return e.kind() == Engine::Kind::kArena ? &static_cast<ArenaEngine&>(e).arena() : nullptr;
}

const Hierarchy* hierarchyOf(Context& ctx) {
  Engine* e = localEngine(ctx, Engine::Kind::kHierarchical);
  return e != nullptr ? &static_cast<HierarchicalEngine*>(e)->hierarchy() : nullptr;
}

}  // namespace shm

}  // namespace loom::comm
