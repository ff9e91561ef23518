#include "rendezvous_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loom/common/error.h"

namespace loom::run {

int pickFreePort() {
  const int fd = LOOM_SYSCHECK(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  LOOM_CHECK_T(IoError, ok, "could not find a free TCP port: ", detail::errnoText(err));
  return ntohs(addr.sin_port);
}

std::unique_ptr<RendezvousStore> openRendezvousStore(const LaunchOptions& options) {
  LOOM_THROW(NotAvailableError,
             "multi-node rendezvous needs the TCPStore, which this build of "
             "loom-run does not have yet (asked for --nnodes ",
             options.nnodes, ")");
}

}  // namespace loom::run
