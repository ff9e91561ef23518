#include "shm/ptrace.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "loom/common/error.h"
#include "shm/os.h"

namespace loom::comm::shm {

namespace {

// The parent of `pid` from /proc/<pid>/stat, 0 when it cannot be read.
pid_t parentOf(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const std::string stat = readFirstLine(path);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  if (std::sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2) return 0;
  return static_cast<pid_t>(ppid);
}

// `pid`, its parent, its parent's parent ... up to (and without) pid 0.
std::vector<pid_t> lineOf(pid_t pid) {
  std::vector<pid_t> line;
  for (pid_t p = pid; p > 0 && line.size() < 4096; p = parentOf(p)) line.push_back(p);
  return line;
}

}  // namespace

int yamaPtraceScope() {
  const std::string scope = readFirstLine("/proc/sys/kernel/yama/ptrace_scope");
  if (scope.empty()) return -1;
  return std::atoi(scope.c_str());
}

pid_t ptracerFor(const std::vector<pid_t>& peers, std::string& why) {
  why.clear();
  const pid_t self = ::getpid();
  std::set<pid_t> readers;
  for (pid_t p : peers) {
    if (p != self && p > 0) readers.insert(p);
  }
  if (readers.empty()) return 0;
  if (readers.size() == 1) return *readers.begin();
  // The nearest process on every reader's line of ancestors.
  std::vector<pid_t> common = lineOf(*readers.begin());
  for (pid_t p : readers) {
    const std::vector<pid_t> line = lineOf(p);
    std::erase_if(common,
                  [&](pid_t a) { return std::find(line.begin(), line.end(), a) == line.end(); });
  }
  if (common.empty() || common.front() <= 1) {
    why = detail::str(readers.size(),
                      " local peers share no ancestor but init (started independently), and Yama "
                      "(ptrace_scope 1) lets a process name one reader only; Loom does not open "
                      "it to every process of the user (PR_SET_PTRACER_ANY)");
    return 0;
  }
  return common.front();
}

std::string allowReadsBy(const std::vector<pid_t>& peers, pid_t& named) {
  named = 0;
  std::string why;
  const pid_t target = ptracerFor(peers, why);
  if (target == 0) return why;
  if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(target), 0, 0, 0) != 0) {
    return detail::str("prctl(PR_SET_PTRACER, ", target, ") failed: ", detail::errnoText(errno));
  }
  named = target;
  return {};
}

void revokeReads() {
  (void)::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
}

namespace {
std::mutex gHoldersMu;
int gHolders = 0;  // gHoldersMu
}  // namespace

void holdReads() {
  std::lock_guard<std::mutex> lock(gHoldersMu);
  ++gHolders;
}

void releaseReads() {
  std::lock_guard<std::mutex> lock(gHoldersMu);
  if (gHolders > 0 && --gHolders == 0) revokeReads();
}

int readHolders() {
  std::lock_guard<std::mutex> lock(gHoldersMu);
  return gHolders;
}

}  // namespace loom::comm::shm
