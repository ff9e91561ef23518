#include "loom/comm/window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "loom/common/error.h"
#include "shm/window_registry.h"

namespace loom::comm {

namespace {

constexpr size_t kPage = 4096;

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, shm::WindowRef> byBase;  // keyed by base address
  // byBase.size(), readable without the lock: a process with no window (most) skips the lock
  // on every large collective.
  std::atomic<size_t> live{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: windows may outlive static teardown
  return *r;
}

std::atomic<uint64_t> nextId{1};

}  // namespace

std::shared_ptr<Window> Window::allocate(size_t bytes) {
  LOOM_CHECK(bytes > 0, "Window::allocate: 0 bytes; expected at least 1");
  LOOM_CHECK(bytes <= (size_t{1} << 46), "Window::allocate: ", bytes,
             " bytes is beyond what a window may hold (64 TiB)");
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  const uint64_t id = nextId.fetch_add(1);
  const std::string name = shm::windowMemfdName(id);
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    LOOM_THROW(IoError, "Window::allocate(", bytes,
               "): memfd_create failed: ", std::strerror(errno));
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    LOOM_THROW(IoError, "Window::allocate(", bytes, "): ", what, " failed: ", std::strerror(err),
               " (is /dev/shm or memory full?)");
  };
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) fail("ftruncate");
  // Reserve every page now: a full tmpfs then fails here, not as SIGBUS inside a collective.
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
    errno = err;
    fail("reserving the pages (posix_fallocate)");
  }
  void* data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) fail("mmap");
  (void)::madvise(data, size, MADV_DONTFORK);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.byBase[reinterpret_cast<uintptr_t>(data)] =
        shm::WindowRef{id, fd, reinterpret_cast<uintptr_t>(data), size};
    r.live.store(r.byBase.size(), std::memory_order_release);
  }
  return std::shared_ptr<Window>(new Window(data, size, fd, id));
}

Window::~Window() {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.byBase.erase(reinterpret_cast<uintptr_t>(data_));
    r.live.store(r.byBase.size(), std::memory_order_release);
  }
  ::munmap(data_, size_);
  ::close(fd_);
}

namespace shm {

std::optional<WindowRef> findWindow(const void* p, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  if (r.live.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.byBase.upper_bound(address);
  if (it == r.byBase.begin()) return std::nullopt;
  --it;
  const WindowRef& w = it->second;
  if (address < w.base || address - w.base > w.bytes || bytes > w.bytes - (address - w.base)) {
    return std::nullopt;
  }
  return w;
}

uint8_t* mapPeerWindow(pid_t pid, const WindowRef& ref, std::string& why) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", static_cast<int>(pid), ref.fd);
  char link[256] = {};
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  const std::string expected = "/memfd:" + windowMemfdName(ref.id) + " ";
  if (n < 0) {
    why = detail::str("readlink ", path, ": ", std::strerror(errno));
    return nullptr;
  }
  if (std::string(link, static_cast<size_t>(n)).rfind(expected, 0) != 0) {
    why = detail::str(path, " is '", link, "', expected the memfd ", windowMemfdName(ref.id),
                      " (was the window freed during the collective?)");
    return nullptr;
  }
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    why = detail::str("open ", path, ": ", std::strerror(errno));
    return nullptr;
  }
  void* local = ::mmap(nullptr, ref.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (local == MAP_FAILED) {
    why = detail::str("mmap of ", ref.bytes, " bytes of ", path, ": ", std::strerror(err));
    return nullptr;
  }
  (void)::madvise(local, ref.bytes, MADV_DONTFORK);
  return static_cast<uint8_t*>(local);
}

std::string windowMemfdName(uint64_t id) {
  return "loom-window-" + std::to_string(id);
}

}  // namespace shm

}  // namespace loom::comm
