// EventPool: the nccl backend's CUDA events, reused instead of created and destroyed per
// operation (cudaEventCreate / Destroy cost microseconds each and may synchronize).
//
// Contract
// - acquire() hands out an event (a free one, else a new one from NcclApi::createEvent) as a
//   shared handle; when the last copy of the handle goes (its Work, the watchdog), the event
//   goes back to the pool. An event is reused only once nobody holds it, so a Work's event is
//   never re-recorded while the Work can still look at it.
// - At most `keep` free events are kept; beyond that, a returned event is destroyed. The pool's
//   core outlives the pool while handles are out (they hold it); destroying the core destroys
//   its free events.
// - Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "nccl/nccl_api.h"

namespace loom::nccl_detail {

class EventPool {
 public:
  explicit EventPool(std::shared_ptr<NcclApi> api, size_t keep = 256)
      : core_(std::make_shared<Core>(std::move(api), keep)) {}

  std::shared_ptr<void> acquire() {
    Event e = nullptr;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      if (!core_->free.empty()) {
        e = core_->free.back();
        core_->free.pop_back();
      }
    }
    if (e == nullptr) {
      e = core_->api->createEvent();
      std::lock_guard<std::mutex> lock(core_->mu);
      ++core_->created;
    }
    std::shared_ptr<Core> core = core_;
    return std::shared_ptr<void>(e, [core](void* event) { core->release(event); });
  }

  size_t created() const {
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->created;
  }
  size_t idle() const {
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->free.size();
  }

 private:
  struct Core {
    Core(std::shared_ptr<NcclApi> a, size_t k) : api(std::move(a)), keep(k) {}
    ~Core() {
      for (Event e : free) api->destroyEvent(e);
    }
    void release(Event e) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (free.size() < keep) {
          free.push_back(e);
          return;
        }
      }
      api->destroyEvent(e);
    }
    const std::shared_ptr<NcclApi> api;
    const size_t keep;
    mutable std::mutex mu;
    std::vector<Event> free;
    size_t created = 0;
  };
  std::shared_ptr<Core> core_;
};

}  // namespace loom::nccl_detail
