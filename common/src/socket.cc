#include "loom/common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "loom/common/error.h"

namespace loom::net {

void Socket::reset() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string formatAddress(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return detail::str(host, ":", port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return detail::str("[", host, "]:", port);
  }
  return "<unknown address family>";
}

std::string formatHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return detail::str("[", host, "]:", port);
  return detail::str(host.empty() ? "*" : host, ":", port);
}

std::string localAddressOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "<unknown>";
  return formatAddress(addr);
}

std::string peerAddressOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "<unknown>";
  return formatAddress(addr);
}

int localPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  LOOM_SYSCHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), "getsockname");
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

bool thisProcessListensOn(int port) {
  if (port <= 0 || port > 65535) return false;
  // Lines of /proc/net/tcp: "sl local_address rem_address st ... uid timeout inode ...", the
  // local address "0100007F:1F90" (hex address, hex port), st 0A = LISTEN.
  std::set<unsigned long> listening;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    char line[512];
    bool header = true;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::exchange(header, false)) continue;
      char local[128];
      char remote[128];
      unsigned state = 0;
      unsigned long inode = 0;
      // sl: local remote st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      if (std::sscanf(line, " %*s %127s %127s %x %*s %*s %*s %*u %*u %lu", local, remote, &state,
                      &inode) != 4) {
        continue;
      }
      const char* colon = std::strrchr(local, ':');
      if (state != 0x0A || colon == nullptr || inode == 0) continue;
      if (std::strtol(colon + 1, nullptr, 16) == port) listening.insert(inode);
    }
    std::fclose(f);
  }
  if (listening.empty()) return false;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool found = false;
  while (const dirent* entry = ::readdir(dir)) {
    char link[64];
    const std::string fdPath = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = ::readlink(fdPath.c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = 0;
    unsigned long inode = 0;
    if (std::sscanf(link, "socket:[%lu]", &inode) == 1 && listening.count(inode) != 0) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int port, bool passive) {
  LOOM_CHECK(port >= 0 && port <= 65535, "port ", port, " is out of range 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const bool any = host.empty() || host == "*";
  const std::string service = std::to_string(port);
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    LOOM_THROW(IoError, "cannot resolve ", formatHostPort(host, port), ": ", gai_strerror(rc));
  }
  return AddrInfoPtr(result);
}

}  // namespace

Socket listenOn(const std::string& host, int port, int backlog) {
  AddrInfoPtr list = resolve(host, port, /*passive=*/true);
  std::string lastError = "no address";
  // Prefer IPv4 first for the wildcard: peers usually connect with an IPv4 literal.
  for (int pass = 0; pass < 2; ++pass) {
    for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      if ((pass == 0) != (ai->ai_family == AF_INET)) continue;
      Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!s.valid()) {
        lastError = detail::errnoText(errno);
        continue;
      }
      const int one = 1;
      setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), backlog) != 0) {
        lastError = detail::errnoText(errno);
        continue;
      }
      return s;
    }
  }
  LOOM_THROW(IoError, "cannot listen on ", formatHostPort(host, port), ": ", lastError);
}

Socket connectTo(const std::string& host, int port, milliseconds timeout) {
  Deadline deadline(timeout);
  std::mt19937_64 rng(std::random_device{}());
  milliseconds backoff(10);
  int attempts = 0;
  std::string lastError = "not attempted";
  for (;;) {
    ++attempts;
    try {
      AddrInfoPtr list = resolve(host, port, /*passive=*/false);
      for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
        Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!s.valid()) {
          lastError = detail::errnoText(errno);
          continue;
        }
        // Non-blocking connect so the attempt itself honours the deadline.
        setNonBlocking(s.fd(), true);
        int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd pfd{s.fd(), POLLOUT, 0};
          const int ready =
              ::poll(&pfd, 1, std::max(1, deadline.pollTimeoutMs(milliseconds(5000))));
          if (ready == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            rc = -1;
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0) {
          setNonBlocking(s.fd(), false);
          return s;
        }
        lastError = detail::errnoText(errno);
      }
    } catch (const IoError& e) {
      lastError = e.what();  // name resolution may fail transiently while a peer starts
    }
    if (deadline.expired()) break;
    // Exponential backoff with full jitter so that many clients don't retry in lockstep.
    std::uniform_int_distribution<int64_t> jitter(backoff.count() / 2, backoff.count());
    std::this_thread::sleep_for(std::min(milliseconds(jitter(rng)), deadline.remaining()));
    backoff = std::min(backoff * 2, milliseconds(1000));
    if (deadline.expired()) break;
  }
  LOOM_THROW(TimeoutError, "cannot connect to ", formatHostPort(host, port), " after ", attempts,
             " attempt(s) over ", deadline.elapsed().count(), " ms; last error: ", lastError);
}

Socket acceptWithDeadline(int listenFd, const Deadline& deadline) {
  for (;;) {
    pollfd pfd{listenFd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, deadline.pollTimeoutMs());
    if (ready < 0 && errno != EINTR) LOOM_SYSCHECK(ready, "poll on listening socket");
    if (ready > 0) {
      const int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) return Socket(fd);
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        LOOM_SYSCHECK(fd, "accept on ", localAddressOf(listenFd));
      }
    }
    if (deadline.expired()) return Socket();
  }
}

std::string localAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "";
  std::string out;
  for (addrinfo* ai = found; ai != nullptr && out.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) out = text;
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  return out;
}

void setNonBlocking(int fd, bool on) {
  const int flags = LOOM_SYSCHECK(::fcntl(fd, F_GETFL), "fcntl(F_GETFL)");
  const int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (want != flags) LOOM_SYSCHECK(::fcntl(fd, F_SETFL, want), "fcntl(F_SETFL)");
}

void setNoDelay(int fd) {
  const int one = 1;
  LOOM_SYSCHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), "TCP_NODELAY");
}

void setKeepAlive(int fd) {
  const int one = 1;
  LOOM_SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)), "SO_KEEPALIVE");
}

void setBufferSizes(int fd, int bytes) {
  // The kernel caps these at net.core.{r,w}mem_max; a smaller buffer is not an error.
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void setCloseOnExec(int fd) {
  const int flags = LOOM_SYSCHECK(::fcntl(fd, F_GETFD), "fcntl(F_GETFD)");
  LOOM_SYSCHECK(::fcntl(fd, F_SETFD, flags | FD_CLOEXEC), "fcntl(F_SETFD)");
}

namespace {

void waitReady(int fd, short events, const Deadline& deadline, const std::string& what, size_t done,
               size_t total, const char* verb) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    const int ready = ::poll(&pfd, 1, deadline.pollTimeoutMs());
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) LOOM_SYSCHECK(ready, "poll while ", verb, " ", what);
    if (deadline.expired()) {
      LOOM_THROW(TimeoutError, "timed out after ", deadline.elapsed().count(), " ms ", verb, " ",
                 what, " (", done, " of ", total, " bytes done)");
    }
  }
}

}  // namespace

void writeFull(int fd, const void* data, size_t n, const Deadline& deadline,
               const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      waitReady(fd, POLLOUT, deadline, what, done, n, "writing to");
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    LOOM_THROW(IoError, "write to ", what, " failed after ", done, " of ", n,
               " bytes: ", detail::errnoText(errno));
  }
}

void readFull(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      LOOM_THROW(IoError, "connection closed by ", what, " after ", done, " of ", n, " bytes");
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      waitReady(fd, POLLIN, deadline, what, done, n, "reading from");
      continue;
    }
    if (errno == EINTR) continue;
    LOOM_THROW(IoError, "read from ", what, " failed after ", done, " of ", n,
               " bytes: ", detail::errnoText(errno));
  }
}

}  // namespace loom::net
