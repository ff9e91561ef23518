// tcp_baseline: what raw loopback TCP does on this machine, the yardstick of issue 5's targets
// ("60% of loopback TCP stream rate", "within 2x of a raw TCP ping-pong"). Two processes (the
// program forks), one TCP connection over 127.0.0.1 with TCP_NODELAY:
//   ping-pong   8-byte messages bounced back and forth; round-trip time, median and p99, once
//               with blocking reads and once busy-polling non-blocking reads;
//   stream      one direction, 1 MiB writes, 4 MiB socket buffers; GB/s (1e9 bytes/s), once
//               with blocking reads and writes and once busy-polling non-blocking ones (on a
//               VM a blocked reader's wake-up costs tens of µs, so the two differ ~2x);
//   ring        --ring-ranks processes (default 2, then 4), each streaming to the next and from the
//               previous at once over its own connection (one thread per process, poll() or
//               busy-polling); the aggregate GB/s of all streams, the loopback capacity of
//               the machine that bounds an N-rank collective: an all-reduce pushes
//               2 (N - 1) bytes per buffer byte through loopback, so its busbw is at most this
//               aggregate / N (the same bound holds for all-gather; a chain broadcast moves
//               N - 1 bytes per buffer byte: aggregate / (N - 1)).
// Prints a small Markdown table. No Loom code involved.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp_baseline: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

void setOptions(int fd) {
  int one = 1;
  int buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

void writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      die("write");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Reads exactly n bytes; on a non-blocking socket EAGAIN is retried (busy polling).
void readAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      die("read");
    }
    if (k == 0) {
      errno = ECONNRESET;
      die("read (peer closed)");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void setNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

struct Params {
  int roundTrips = 10000;
  size_t streamBytes = size_t{1} << 30;
  size_t chunk = size_t{1} << 20;
};

int listenLoopback(int& port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) die("bind");
  if (listen(fd, 1) != 0) die("listen");
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

int connectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) die("connect");
  return fd;
}

// The child: connects, echoes the ping-pongs, then receives the two streams.
void child(int port, const Params& p) {
  const int fd = connectLoopback(port);
  setOptions(fd);
  char msg[8];
  for (bool spin : {false, true}) {
    setNonBlocking(fd, spin);
    for (int i = 0; i < p.roundTrips; ++i) {
      readAll(fd, msg, sizeof(msg));
      writeAll(fd, msg, sizeof(msg));
    }
  }
  std::vector<char> buf(p.chunk);
  for (bool spin : {false, true}) {
    setNonBlocking(fd, spin);
    for (size_t got = 0; got < p.streamBytes; got += p.chunk) readAll(fd, buf.data(), p.chunk);
    writeAll(fd, msg, 1);  // done
  }
  ::close(fd);
  std::_Exit(0);
}

// One process of the ring: sends `bytes` to the next process while receiving as many from the
// previous one, on one thread (non-blocking sockets; poll() when !spin), at most `chunk` bytes a
// call, walking through send and receive buffers of `span` bytes: a span of one chunk stays in
// cache, a span of 64 MiB makes every copy touch memory as a 64 MiB collective does. Writes its
// elapsed seconds to `report` once a byte from `go` started it.
[[noreturn]] void ringMember(int out, int in, size_t bytes, size_t chunk, size_t span, bool spin,
                             int go, int report) {
  setOptions(out);
  setOptions(in);
  setNonBlocking(out, true);
  setNonBlocking(in, true);
  std::vector<char> sendBuf(span, 1), recvBuf(span);
  char c;
  if (::read(go, &c, 1) != 1) die("read(go)");
  const auto start = std::chrono::steady_clock::now();
  size_t sent = 0, got = 0;
  while (sent < bytes || got < bytes) {
    if (!spin) {
      pollfd fds[2] = {{out, static_cast<short>(sent < bytes ? POLLOUT : 0), 0},
                       {in, static_cast<short>(got < bytes ? POLLIN : 0), 0}};
      if (::poll(fds, 2, 10000) < 0 && errno != EINTR) die("poll");
    }
    if (sent < bytes) {
      const size_t n = std::min({chunk - sent % chunk, bytes - sent, span - sent % span});
      const ssize_t k = ::send(out, sendBuf.data() + sent % span, n, MSG_NOSIGNAL);
      if (k > 0) sent += static_cast<size_t>(k);
      if (k < 0 && errno != EAGAIN && errno != EINTR) die("send");
    }
    if (got < bytes) {
      const size_t n = std::min({chunk - got % chunk, bytes - got, span - got % span});
      const ssize_t k = ::recv(in, recvBuf.data() + got % span, n, 0);
      if (k > 0) got += static_cast<size_t>(k);
      if (k == 0) die("recv (peer closed)");
      if (k < 0 && errno != EAGAIN && errno != EINTR) die("recv");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (::write(report, &seconds, sizeof(seconds)) != sizeof(seconds)) die("write(report)");
  std::_Exit(0);
}

// Aggregate GB/s of `ranks` processes streaming around a ring, `bytes` each.
double ringAggregate(int ranks, size_t bytes, size_t chunk, size_t span, bool spin) {
  std::vector<int> listeners(static_cast<size_t>(ranks)), ports(static_cast<size_t>(ranks));
  for (int i = 0; i < ranks; ++i) listeners[i] = listenLoopback(ports[i]);
  int go[2], report[2];
  if (::pipe(go) != 0 || ::pipe(report) != 0) die("pipe");
  std::vector<pid_t> pids;
  for (int i = 0; i < ranks; ++i) {
    const pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      const int out = connectLoopback(ports[(i + 1) % ranks]);
      const int in = accept(listeners[i], nullptr, nullptr);
      if (in < 0) die("accept");
      ringMember(out, in, bytes, chunk, span, spin, go[0], report[1]);
    }
    pids.push_back(pid);
  }
  const std::vector<char> start(static_cast<size_t>(ranks), 'g');
  if (::write(go[1], start.data(), start.size()) != static_cast<ssize_t>(start.size())) {
    die("write(go)");
  }
  double slowest = 0;
  for (int i = 0; i < ranks; ++i) {
    double seconds = 0;
    if (::read(report[0], &seconds, sizeof(seconds)) != sizeof(seconds)) die("read(report)");
    slowest = std::max(slowest, seconds);
  }
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  for (int fd : {go[0], go[1], report[0], report[1]}) ::close(fd);
  for (int fd : listeners) ::close(fd);
  return static_cast<double>(bytes) * ranks / slowest / 1e9;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q / 100.0 * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Raw loopback TCP: 8-byte ping-pong round trip, one-stream rate and the aggregate "
      "rate of a ring of streams.",
      "tcp_baseline"};
  Params p;
  app.add_option("--round-trips", p.roundTrips, "ping-pongs per mode")->capture_default_str();
  app.add_option("--stream-bytes", p.streamBytes, "bytes streamed")->capture_default_str();
  std::vector<int> ringRanks{2, 4};
  app.add_option("--ring-ranks", ringRanks, "process counts of the ring measurement (0: skip)")
      ->capture_default_str();
  std::vector<size_t> ringSpans{p.chunk};
  app.add_option("--ring-span", ringSpans,
                 "bytes of the buffers each ring process walks through, a multiple of 1 MiB "
                 "(1 MiB stays in cache: the upper bound; 64 MiB makes every copy touch memory)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  for (size_t span : ringSpans) {
    if (span < p.chunk || span % p.chunk != 0) {
      std::fprintf(stderr, "tcp_baseline: --ring-span must be a multiple of 1 MiB, got %zu\n",
                   span);
      return 2;
    }
  }
  for (int n : ringRanks) {
    if (n == 1 || n < 0 || n > 64) {
      std::fprintf(stderr, "tcp_baseline: --ring-ranks must be 0 or in [2, 64], got %d\n", n);
      return 2;
    }
  }
  if (p.roundTrips < 1 || p.streamBytes < p.chunk) {
    std::fprintf(stderr, "tcp_baseline: --round-trips must be >= 1 and --stream-bytes >= 1 MiB\n");
    return 2;
  }

  int port = 0;
  const int lfd = listenLoopback(port);
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) child(port, p);
  const int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) die("accept");
  setOptions(fd);

  using Clock = std::chrono::steady_clock;
  char msg[8] = {};
  double rtt[2][2];  // [spin][median, p99] in microseconds
  for (int spin = 0; spin < 2; ++spin) {
    setNonBlocking(fd, spin != 0);
    std::vector<double> times;
    times.reserve(static_cast<size_t>(p.roundTrips));
    for (int i = 0; i < p.roundTrips; ++i) {
      const auto start = Clock::now();
      writeAll(fd, msg, sizeof(msg));
      readAll(fd, msg, sizeof(msg));
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    rtt[spin][0] = percentile(times, 50);
    rtt[spin][1] = percentile(times, 99);
  }
  std::vector<char> buf(p.chunk, 1);
  double streamGBs[2];  // [spin]
  for (int spin = 0; spin < 2; ++spin) {
    setNonBlocking(fd, spin != 0);
    const auto start = Clock::now();
    for (size_t sent = 0; sent < p.streamBytes; sent += p.chunk) {
      writeAll(fd, buf.data(), p.chunk);
    }
    readAll(fd, msg, 1);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    streamGBs[spin] = static_cast<double>(p.streamBytes) / seconds / 1e9;
  }
  int status = 0;
  waitpid(pid, &status, 0);

  std::printf("| raw loopback TCP | value |\n|---|---:|\n");
  std::printf("| 8-byte round trip, blocking reads (median / p99) | %.1f / %.1f us |\n", rtt[0][0],
              rtt[0][1]);
  std::printf("| 8-byte round trip, busy-polling reads (median / p99) | %.1f / %.1f us |\n",
              rtt[1][0], rtt[1][1]);
  std::printf("| one stream, 1 MiB writes, blocking | %.2f GB/s |\n", streamGBs[0]);
  std::printf("| one stream, 1 MiB writes, busy-polling | %.2f GB/s |\n", streamGBs[1]);
  for (int n : ringRanks) {
    if (n == 0) continue;
    const size_t each = std::max(p.chunk, p.streamBytes / static_cast<size_t>(n));
    for (size_t span : ringSpans) {
      for (bool spin : {false, true}) {
        std::printf("| ring of %d streams, aggregate, %s, %zu MiB buffers | %.2f GB/s |\n", n,
                    spin ? "busy-polling" : "blocking", span >> 20,
                    ringAggregate(n, each, p.chunk, span, spin));
      }
    }
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
