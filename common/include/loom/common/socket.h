// Socket utilities shared by the TCPStore and the tcp transport.
//
// - Socket is an owning file descriptor (RAII, movable).
// - listenOn(host, port) binds and listens; port 0 picks a free port (read it back with
//   localPort). "Address in use" and friends throw IoError naming host:port.
// - connectTo(host, port, timeout) retries refused/unreachable connects with exponential
//   backoff and jitter until the deadline; the TimeoutError names host:port, the attempts,
//   how long it tried and the last error.
// - readFull / writeFull move exactly n bytes, blocking in poll() against a Deadline; a
//   closed peer is an IoError ("connection closed by ..."), a passed deadline a TimeoutError.
// All functions are thread-safe in the POSIX sense (no shared state).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <string>
#include <utility>

#include "loom/common/deadline.h"

namespace loom::net {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

// "host:port" for IPv4, "[host]:port" for IPv6.
std::string formatAddress(const sockaddr_storage& addr);
std::string formatHostPort(const std::string& host, int port);
std::string localAddressOf(int fd);
std::string peerAddressOf(int fd);
int localPort(int fd);

// This machine's hostname (gethostname).
std::string hostname();
// Whether this process holds a TCP socket listening on `port` (any address, IPv4 or IPv6, in
// this network namespace): /proc/net/tcp{,6}'s listening sockets on that port, matched by
// inode against /proc/self/fd. False when /proc cannot be read. Tells a process that hosts a
// store's server (torch's TCPStore runs it in the process that created it) from its clients.
bool thisProcessListensOn(int port);
// The local address the kernel would use to reach `host` (a connected UDP socket; nothing is
// sent), e.g. "10.213.7.2". Empty when `host` does not resolve or is unreachable. Used to
// listen on an address peers can reach, since Debian maps the hostname to 127.0.1.1.
std::string localAddressTowards(const std::string& host);

// host may be a name, an IPv4/IPv6 literal, "" or "*" (all interfaces), or "localhost".
Socket listenOn(const std::string& host, int port, int backlog = 512);
Socket connectTo(const std::string& host, int port, milliseconds timeout);
// Accepts one connection; returns an invalid Socket when none arrives before the deadline.
Socket acceptWithDeadline(int listenFd, const Deadline& deadline);

void setNonBlocking(int fd, bool on = true);
void setNoDelay(int fd);
void setKeepAlive(int fd);
void setBufferSizes(int fd, int bytes);
void setCloseOnExec(int fd);

// `what` names the peer and operation for errors, e.g. "TCPStore server 10.0.0.1:29500".
void writeFull(int fd, const void* data, size_t n, const Deadline& deadline,
               const std::string& what);
void readFull(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what);

}  // namespace loom::net
