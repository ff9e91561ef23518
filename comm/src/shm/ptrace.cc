#include "shm/ptrace.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
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

namespace {

int ptracerCall(pid_t pid) {
  return ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(pid), 0, 0, 0) == 0 ? 0 : errno;
}

std::mutex gGrantsMu;
int (*gCall)(pid_t) = ptracerCall;          // gGrantsMu
std::map<int, std::vector<pid_t>> gGrants;  // gGrantsMu: grant -> its readers
int gLastGrant = 0;                         // gGrantsMu
pid_t gNamed = 0;                           // gGrantsMu: what PR_SET_PTRACER names now

// Every held grant's readers, and `more`.
std::vector<pid_t> heldReadersAnd(const std::vector<pid_t>& more) {
  std::vector<pid_t> all = more;
  for (const auto& [id, readers] : gGrants) all.insert(all.end(), readers.begin(), readers.end());
  return all;
}

}  // namespace

std::string grantReads(const std::vector<pid_t>& peers, int& grant) {
  grant = 0;
  std::lock_guard<std::mutex> lock(gGrantsMu);
  std::string why;
  if (ptracerFor(peers, why) == 0) return why;  // no reader (""), or none fits on their own
  const pid_t target = ptracerFor(heldReadersAnd(peers), why);
  if (target == 0) {
    return detail::str(why, "; that counts the readers of ", gGrants.size(),
                       " other group(s) of this process, which hold the one name Yama keeps");
  }
  if (target != gNamed) {
    const int err = gCall(target);
    if (err != 0) {
      return detail::str("prctl(PR_SET_PTRACER, ", target, ") failed: ", detail::errnoText(err));
    }
    gNamed = target;
  }
  grant = ++gLastGrant;
  gGrants.emplace(grant, peers);
  return {};
}

void endGrant(int grant) {
  std::lock_guard<std::mutex> lock(gGrantsMu);
  if (grant == 0 || gGrants.erase(grant) == 0) return;
  std::string why;
  const pid_t target = gGrants.empty() ? 0 : ptracerFor(heldReadersAnd({}), why);
  // A reader that has gone makes the narrower name unknown: the wider one stays until the last
  // grant ends.
  if (!gGrants.empty() && target == 0) return;
  if (target == gNamed) return;
  const int err = gCall(target);
  if (err == 0 || target == 0) gNamed = target;  // a failed withdrawal names nothing we know of
}

pid_t namedReader() {
  std::lock_guard<std::mutex> lock(gGrantsMu);
  return gNamed;
}

int readGrants() {
  std::lock_guard<std::mutex> lock(gGrantsMu);
  return static_cast<int>(gGrants.size());
}

void setPtracerCallForTest(int (*call)(pid_t)) {
  std::lock_guard<std::mutex> lock(gGrantsMu);
  gCall = call != nullptr ? call : ptracerCall;
}

}  // namespace loom::comm::shm
