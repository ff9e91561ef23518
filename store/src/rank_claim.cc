#include "loom/store/rank_claim.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/socket.h"

namespace loom {

namespace {

std::string firstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/self/stat: when this process started, in clock ticks since boot. The
// fields after the command name (which may hold spaces and parentheses) start after its last ')'.
std::string startTime() {
  const std::string stat = firstLine("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field;
}

struct Claimant {
  std::string host, pid;
};

Claimant parse(const std::string& value) {
  Claimant c;
  const size_t first = value.find('\n');
  c.host = value.substr(0, first);
  if (first != std::string::npos) {
    const size_t second = value.find('\n', first + 1);
    c.pid = value.substr(first + 1, second == std::string::npos ? second : second - first - 1);
  }
  return c;
}

}  // namespace

std::string thisProcess() {
  return detail::str(net::hostname(), "\n", ::getpid(), "\n",
                     firstLine("/proc/sys/kernel/random/boot_id"), "\n", startTime());
}

void claimRank(Store& store, const std::string& key, int rank, int size) {
  const std::string mine = thisProcess();
  const std::string holder = toString(store.compareSet(key, Bytes{}, toBytes(mine)));
  if (holder == mine) return;
  const Claimant first = parse(holder);
  const Claimant me = parse(mine);
  // No source location: the message is the user's, and it travels to the other ranks' errors.
  throw InvalidArgumentError(
      detail::str("rank ", rank, " of this group is claimed by two processes: host ", first.host,
                  ", pid ", first.pid, " (first) and host ", me.host, ", pid ", me.pid,
                  " (refused); each process must have its own RANK (0..", size - 1, "). If host ",
                  first.host, ", pid ", first.pid,
                  " has ended, the store holds an earlier group's keys under the same prefix (",
                  key, "): give each group its own store or prefix"));
}

}  // namespace loom
