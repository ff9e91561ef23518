#include "output.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "loom/common/error.h"

namespace loom::run::output {
namespace {

// false when the fd is gone (EPIPE, EBADF): nothing more is written to it.
bool writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

class Writer {
 public:
  Writer() {
    wake_ = LOOM_SYSCHECK(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), "eventfd for loom-run's output");
  }

  void write(int fd, std::string text) {
    if (text.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    Out& out = outs_[index(fd)];
    if (out.broken) return;
    out.pending += text.size();
    if (out.pending >= kHighWater) out.backedUp = true;  // before anyone can see it backed up
    queue_.emplace_back(fd, std::move(text));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    work_.notify_one();
  }

  size_t pending(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    return outs_[index(fd)].pending;
  }

  int wakeFd() const { return wake_; }

  bool flush(const std::function<bool()>& stop) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty() && !writing_) return true;
      if (stop && stop()) return false;
      idle_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

 private:
  struct Out {
    size_t pending = 0;
    bool broken = false;
    bool backedUp = false;  // reached kHighWater; wake the loop when it drains to half
  };

  static size_t index(int fd) { return fd == 1 ? 0 : 1; }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [this] { return !queue_.empty(); });
      auto [fd, text] = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      const bool ok = writeAll(fd, text.data(), text.size());
      lock.lock();
      writing_ = false;
      Out& out = outs_[index(fd)];
      out.pending -= text.size();
      if (!ok) dropLocked(fd, out);
      if (out.backedUp && out.pending <= kHighWater / 2) {
        out.backedUp = false;
        const uint64_t one = 1;
        [[maybe_unused]] const ssize_t r = ::write(wake_, &one, sizeof(one));
      }
      if (queue_.empty()) idle_.notify_all();
    }
  }

  void dropLocked(int fd, Out& out) {
    out.broken = true;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->first != fd) {
        ++it;
        continue;
      }
      out.pending -= it->second.size();
      it = queue_.erase(it);
    }
  }

  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<std::pair<int, std::string>> queue_;
  Out outs_[2];
  bool writing_ = false;
  int wake_ = -1;
  std::thread thread_;
};

// Never destroyed: the thread may still be blocked in write() when the process exits.
Writer& writer() {
  static Writer* w = new Writer();
  return *w;
}

}  // namespace

void write(int fd, std::string text) {
  writer().write(fd, std::move(text));
}

size_t pending(int fd) {
  return writer().pending(fd);
}

int wakeFd() {
  return writer().wakeFd();
}

void clearWake() {
  uint64_t n = 0;
  while (::read(writer().wakeFd(), &n, sizeof(n)) == static_cast<ssize_t>(sizeof(n))) {
  }
}

bool flush(const std::function<bool()>& stop) {
  return writer().flush(stop);
}

}  // namespace loom::run::output
