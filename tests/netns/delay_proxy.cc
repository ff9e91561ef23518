// delay_proxy: a TCP forwarder that delays every byte by a fixed time in each direction.
//
// The kernel of the test machines has no netem, so the netns test adds latency in user space:
// a host reaches a service through this proxy instead of directly, and every chunk read from
// either side is written to the other side `--delay-ms` later (latency, not a bandwidth cap:
// chunks queue in order, each with its own due time). One poll loop, no threads. It exits
// after --max-seconds whatever happens, so a failed test can never leave it behind.
//
//   delay_proxy --listen 10.213.7.11:29600 --target 10.213.7.10:29500 --delay-ms 20
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

sockaddr_in parseAddr(const std::string& hostPort) {
  const auto colon = hostPort.rfind(':');
  if (colon == std::string::npos) throw CLI::ValidationError("expected HOST:PORT, got " + hostPort);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(hostPort.substr(colon + 1))));
  if (inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    throw CLI::ValidationError("not an IPv4 address: " + hostPort);
  }
  return addr;
}

struct Chunk {
  Clock::time_point due;
  std::string bytes;
};

// One direction of a connection: bytes read from `from`, written to `to` when due.
struct Direction {
  int from = -1;
  int to = -1;
  std::deque<Chunk> queue;
  bool eof = false;       // `from` said EOF
  bool shutDown = false;  // we passed the EOF on to `to`
};

struct Pair {
  Direction dir[2];
  bool dead = false;
};

void setNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("TCP forwarder adding a fixed delay in both directions", "delay_proxy");
  std::string listen, target;
  int delayMs = 10;
  double maxSeconds = 120;
  app.add_option("--listen", listen, "HOST:PORT to accept on")->required();
  app.add_option("--target", target, "HOST:PORT to forward to")->required();
  app.add_option("--delay-ms", delayMs, "one-way delay in milliseconds")
      ->check(CLI::Range(0, 10000));
  app.add_option("--max-seconds", maxSeconds, "exit after this long")
      ->check(CLI::Range(1.0, 3600.0));
  CLI11_PARSE(app, argc, argv);
  sockaddr_in listenAddr{}, targetAddr{};
  try {
    listenAddr = parseAddr(listen);
    targetAddr = parseAddr(target);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "delay_proxy: %s\n", e.what());
    return 2;
  }
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lfd, reinterpret_cast<sockaddr*>(&listenAddr), sizeof(listenAddr)) != 0 ||
      ::listen(lfd, 64) != 0) {
    std::fprintf(stderr, "delay_proxy: cannot listen on %s: %s\n", listen.c_str(),
                 std::strerror(errno));
    return 1;
  }
  setNonBlocking(lfd);
  const auto delay = std::chrono::milliseconds(delayMs);
  const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(maxSeconds * 1000));
  std::list<Pair> pairs;

  while (Clock::now() < end) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    std::vector<std::pair<Direction*, bool>> owners{{nullptr, false}};  // (direction, writing)
    auto next = end;
    const auto now = Clock::now();
    for (auto& p : pairs) {
      for (auto& d : p.dir) {
        if (!d.eof) {
          fds.push_back({d.from, POLLIN, 0});
          owners.emplace_back(&d, false);
        }
        if (d.queue.empty()) continue;
        if (d.queue.front().due <= now) {
          fds.push_back({d.to, POLLOUT, 0});
          owners.emplace_back(&d, true);
        } else {
          next = std::min(next, d.queue.front().due);
        }
      }
    }
    const auto waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    poll(fds.data(), fds.size(),
         static_cast<int>(std::max<long>(0, std::min<long>(waitMs.count() + 1, 1000))));

    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) break;
        // The target may not listen yet (its host starts later): retry for up to 10 s.
        int t = -1;
        for (int attempt = 0; attempt < 200 && t < 0; ++attempt) {
          t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (connect(t, reinterpret_cast<sockaddr*>(&targetAddr), sizeof(targetAddr)) != 0) {
            close(t);
            t = -1;
            usleep(50 * 1000);  // retry interval, bounded by the 200 attempts
          }
        }
        if (t < 0) {
          close(c);
          continue;
        }
        for (int fd : {c, t}) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          setNonBlocking(fd);
        }
        Pair& p = pairs.emplace_back();
        p.dir[0].from = c;
        p.dir[0].to = t;
        p.dir[1].from = t;
        p.dir[1].to = c;
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      Direction& d = *owners[i].first;
      if (fds[i].revents == 0) continue;
      if (!owners[i].second) {
        char buf[65536];
        const ssize_t n = read(d.from, buf, sizeof(buf));
        if (n > 0) {
          d.queue.push_back({Clock::now() + delay, std::string(buf, static_cast<size_t>(n))});
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          d.eof = true;
        }
      } else if (!d.queue.empty()) {
        Chunk& c = d.queue.front();
        const ssize_t n = send(d.to, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c.bytes.erase(0, static_cast<size_t>(n));
          if (c.bytes.empty()) d.queue.pop_front();
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          d.queue.clear();
          d.eof = true;
        }
      }
    }
    // Pass EOFs on once their direction drained; drop pairs closed both ways.
    for (auto it = pairs.begin(); it != pairs.end();) {
      bool closed = true;
      for (auto& d : it->dir) {
        if (d.eof && d.queue.empty() && !d.shutDown) {
          shutdown(d.to, SHUT_WR);
          d.shutDown = true;
        }
        closed = closed && d.shutDown;
      }
      if (closed) {
        close(it->dir[0].from);
        close(it->dir[1].from);
        it = pairs.erase(it);
      } else {
        ++it;
      }
    }
  }
  return 0;
}
