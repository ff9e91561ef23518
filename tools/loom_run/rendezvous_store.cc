#include "rendezvous_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loom/common/error.h"
#include "loom/store/tcp_store.h"

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

namespace {

class TcpRendezvousStore : public RendezvousStore {
 public:
  explicit TcpRendezvousStore(const LaunchOptions& o) {
    // Node 0 hosts the server (all interfaces, --master-port) and talks to it directly.
    const bool viaEndpoint = o.nodeRank != 0 && !o.rdzvHost.empty();
    const std::string host = viaEndpoint ? o.rdzvHost : o.masterAddr;
    const int port = viaEndpoint ? o.rdzvPort : o.masterPort;
    endpoint_ = host + ":" + std::to_string(port);
    TCPStoreOptions options;
    options.timeout = o.rdzvTimeout;
    options.rank = o.nodeRank;
    options.isServer = o.nodeRank == 0;
    options.waitForWorkers = false;
    try {
      store_ = std::make_unique<TCPStore>(host, port, options);
    } catch (const TimeoutError& e) {
      LOOM_THROW(TimeoutError, "rendezvous: node 0's store at ", endpoint_,
                 " could not be reached within ", o.rdzvTimeout.count(),
                 " ms (node 0 never arrived, or a wrong --master-addr/--master-port): ", e.what());
    } catch (const IoError& e) {
      if (o.nodeRank == 0) {
        LOOM_THROW(IoError, "rendezvous: node 0 could not host the store on port ", o.masterPort,
                   " (--master-port): ", e.what());
      }
      LOOM_THROW(IoError, "rendezvous: cannot reach node 0's store at ", endpoint_, ": ", e.what());
    }
  }
  Store& store() override { return *store_; }
  std::string endpoint() const override { return endpoint_; }

 private:
  std::string endpoint_;
  std::unique_ptr<TCPStore> store_;
};

}  // namespace

std::unique_ptr<RendezvousStore> openRendezvousStore(const LaunchOptions& options) {
  return std::make_unique<TcpRendezvousStore>(options);
}

}  // namespace loom::run
