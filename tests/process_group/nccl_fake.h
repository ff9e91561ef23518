// FakeNccl: an NcclApi (process_group/src/nccl/nccl_api.h) with no GPU, for the nccl backend's
// unit tests. It runs nothing: it records every call as a line ("send(peer=1, count=4,
// ncclUint8)", "recordEvent(e3, legacy)") and keeps the state of its events. The device is
// instant by default (an event recorded on a stream the fake created completes at once);
// with `stall` set it never completes anything until commAbort, which ends every event as
// ncclCommAbort ends the kernels. Thread-safe.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nccl/nccl_api.h"

namespace loom::nccl_detail {

class FakeNccl final : public NcclApi {
 public:
  // Settings (before use).
  int devices = 1;
  bool stall = false;
  std::string asyncError;  // when set, commGetAsyncError reports ncclSystemError (2)
  bool quiet = false;      // record no calls (for timing the backend's own host path)

  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // The recorded calls whose text starts with one of `prefixes`.
  std::vector<std::string> callsOf(const std::vector<std::string>& prefixes) {
    std::vector<std::string> out;
    for (const auto& c : calls()) {
      for (const auto& p : prefixes) {
        if (c.rfind(p, 0) == 0) {
          out.push_back(c);
          break;
        }
      }
    }
    return out;
  }
  void clearCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
  }
  int eventsCreated() {
    std::lock_guard<std::mutex> lock(mu_);
    return eventsCreated_;
  }
  int aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }
  // Completes every recorded event (the stalled device catches up).
  void completeAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : events_) e.done = true;
    cv_.notify_all();
  }
  // A name for a stream in the log.
  static std::string streamName(Stream s) {
    if (s == legacyDefaultStream()) return "legacy";
    if (s == perThreadDefaultStream()) return "perthread";
    if (s == nullptr) return "null";
    const auto v = reinterpret_cast<uintptr_t>(s);
    if (v >= kStreamBase && v < kStreamBase + 0x100)
      return "internal" + std::to_string(v - kStreamBase);
    return "user" + std::to_string(v);
  }

  int deviceCount() override { return devices; }
  int currentDevice() override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  void setDevice(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = device;
  }
  Stream createStream() override {
    std::lock_guard<std::mutex> lock(mu_);
    return reinterpret_cast<Stream>(kStreamBase + nextStream_++);
  }
  void destroyStream(Stream) noexcept override {}
  bool streamIdle(Stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : events_) {
      if (e.recorded && !e.done) return false;
    }
    return true;
  }
  Event createEvent() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++eventsCreated_;
    const uintptr_t id = kEventBase + nextEvent_++;
    events_[id] = {};
    return reinterpret_cast<Event>(id);
  }
  void destroyEvent(Event e) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.erase(reinterpret_cast<uintptr_t>(e));
  }
  void recordEvent(Event e, Stream s) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& ev = events_.at(reinterpret_cast<uintptr_t>(e));
    ev.recorded = true;
    ev.done = !stall || aborted_;
    if (!quiet) calls_.push_back("recordEvent(" + eventName(e) + ", " + streamName(s) + ")");
  }
  void streamWaitEvent(Stream s, Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!quiet) calls_.push_back("streamWaitEvent(" + streamName(s) + ", " + eventName(e) + ")");
  }
  EventState queryEvent(Event e, std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(reinterpret_cast<uintptr_t>(e));
    if (it == events_.end() || !it->second.recorded || it->second.done) return EventState::kDone;
    return EventState::kPending;
  }
  void synchronizeEvent(Event e) override {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back("synchronizeEvent(" + eventName(e) + ")");
    cv_.wait(lock, [&] {
      auto it = events_.find(reinterpret_cast<uintptr_t>(e));
      return it == events_.end() || !it->second.recorded || it->second.done;
    });
  }
  void* deviceAlloc(size_t) override { return &scratch_; }
  void deviceFree(void*) noexcept override {}

  size_t uniqueIdBytes() override { return 128; }
  int getUniqueId(std::string& id) override {
    id.assign(128, 'u');
    return kNcclSuccess;
  }
  int commInitRank(Comm* comm, int size, const std::string& id, int rank) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("commInitRank(size=" + std::to_string(size) +
                     ", rank=" + std::to_string(rank) + ", id=" + id.substr(0, 4) + ")");
    *comm = &scratch_;
    return kNcclSuccess;
  }
  int commGetAsyncError(Comm, int* state) override {
    std::lock_guard<std::mutex> lock(mu_);
    *state = asyncError.empty() ? kNcclSuccess : 2;
    return kNcclSuccess;
  }
  int commAbort(Comm) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    ++aborts_;
    aborted_ = true;
    calls_.push_back("commAbort");
    for (auto& [id, e] : events_) e.done = true;
    cv_.notify_all();
    return kNcclSuccess;
  }
  int commDestroy(Comm) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("commDestroy");
    return kNcclSuccess;
  }
  std::string errorString(int result) override {
    return result == 2 ? "unhandled system error" : "result " + std::to_string(result);
  }
  std::string lastError(Comm) override { return asyncError; }
  int groupStart() override { return log("groupStart"); }
  int groupEnd() override { return log("groupEnd"); }
  int allReduce(const void*, void*, size_t count, NcclType type, NcclOp op, Comm,
                Stream s) override {
    return log("allReduce(count=" + std::to_string(count) + ", " + ncclTypeName(type) + ", " +
               ncclOpName(op) + ", " + streamName(s) + ")");
  }
  int broadcast(const void*, void*, size_t count, NcclType type, int root, Comm, Stream) override {
    return log("broadcast(count=" + std::to_string(count) + ", " + ncclTypeName(type) +
               ", root=" + std::to_string(root) + ")");
  }
  int reduce(const void*, void*, size_t count, NcclType type, NcclOp op, int root, Comm,
             Stream) override {
    return log("reduce(count=" + std::to_string(count) + ", " + ncclTypeName(type) + ", " +
               ncclOpName(op) + ", root=" + std::to_string(root) + ")");
  }
  int allGather(const void*, void*, size_t count, NcclType type, Comm, Stream) override {
    return log("allGather(count=" + std::to_string(count) + ", " + ncclTypeName(type) + ")");
  }
  int reduceScatter(const void*, void*, size_t count, NcclType type, NcclOp op, Comm,
                    Stream) override {
    return log("reduceScatter(count=" + std::to_string(count) + ", " + ncclTypeName(type) + ", " +
               ncclOpName(op) + ")");
  }
  int send(const void*, size_t count, NcclType type, int peer, Comm, Stream) override {
    return log("send(peer=" + std::to_string(peer) + ", count=" + std::to_string(count) + ", " +
               ncclTypeName(type) + ")");
  }
  int recv(void*, size_t count, NcclType type, int peer, Comm, Stream) override {
    return log("recv(peer=" + std::to_string(peer) + ", count=" + std::to_string(count) + ", " +
               ncclTypeName(type) + ")");
  }

 private:
  static constexpr uintptr_t kStreamBase = 0x7000;
  static constexpr uintptr_t kEventBase = 0x9000;
  struct EventState_ {
    bool recorded = false;
    bool done = false;
  };
  static std::string eventName(Event e) {
    return "e" + std::to_string(reinterpret_cast<uintptr_t>(e) - kEventBase);
  }
  int log(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!quiet) calls_.push_back(std::move(line));
    return kNcclSuccess;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> calls_;
  std::map<uintptr_t, EventState_> events_;
  uintptr_t nextStream_ = 0;
  uintptr_t nextEvent_ = 0;
  int eventsCreated_ = 0;
  int aborts_ = 0;
  bool aborted_ = false;
  int current_ = 0;
  int32_t scratch_ = 0;
};

}  // namespace loom::nccl_detail
