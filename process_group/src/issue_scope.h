// ProcessGroup::IssueScope: two threads issuing on one group at once (process_group.h's
// contract), found by the second one. Private to process_group.cc and process_group_lists.cc.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "loom/process_group/process_group.h"

namespace loom {

namespace issue_scope {

// This thread's kernel id (what ps -L, gdb and py-spy show), read once per thread.
inline uint64_t threadId() {
  thread_local const uint64_t id = static_cast<uint64_t>(::syscall(SYS_gettid));
  return id;
}

// issuer_'s word: the thread in its high bits, the operation it issues in the low byte.
inline uint64_t issuerWord(OpType type) {
  return threadId() << 8 | static_cast<uint64_t>(type);
}

}  // namespace issue_scope

class ProcessGroup::IssueScope {
 public:
  IssueScope(ProcessGroup& pg, OpType type) : pg_(pg) {
    uint64_t other = 0;
    if (!pg.issuer_.compare_exchange_strong(other, issue_scope::issuerWord(type),
                                            std::memory_order_acquire)) [[unlikely]] {
      pg.concurrentIssue(type, other);  // throws: the destructor does not run
    }
  }
  ~IssueScope() { pg_.issuer_.store(0, std::memory_order_release); }
  IssueScope(const IssueScope&) = delete;
  IssueScope& operator=(const IssueScope&) = delete;

 private:
  ProcessGroup& pg_;
};

}  // namespace loom
