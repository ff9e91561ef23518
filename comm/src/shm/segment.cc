#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "loom/common/error.h"
#include "loom/store/store.h"

namespace loom::comm::shm {

namespace {

// Sizes `fd` to `bytes` and reserves the pages; false (errno set) on failure.
bool reserve(int fd, size_t bytes) {
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return false;
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) errno = err;
  return err == 0;
}

void* mapShared(int fd, size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : base;
}

std::vector<std::string> peerKeys(const std::string& prefix, int size) {
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(detail::str(prefix, r));
  return keys;
}

}  // namespace

std::unique_ptr<Segment> Segment::create(Store& store, int rank, int size, size_t bytes,
                                         const std::string& keyPrefix,
                                         std::chrono::milliseconds timeout, const Init& init,
                                         const Check& check, bool memfd) {
  // ---- first choice: an anonymous memfd, opened by the others through /proc ----
  const std::string memfdKey = keyPrefix + "/memfd";
  std::string memfdName = "none";
  int fd = -1;
  void* base = nullptr;
  size_t mapBytes = bytes;
  if (rank == 0) {
    if (memfd) fd = ::memfd_create("loom-shm", MFD_CLOEXEC);
    if (fd >= 0) {
      if (!reserve(fd, bytes)) {
        const int err = errno;
        ::close(fd);
        store.set(memfdKey, std::string("none"));
        LOOM_THROW(IoError, "cannot reserve ", bytes,
                   " bytes of shared memory: ", detail::errnoText(err));
      }
      base = mapShared(fd, bytes);
      if (base == nullptr) {
        const int err = errno;
        ::close(fd);
        store.set(memfdKey, std::string("none"));
        LOOM_THROW(IoError, "rank 0: cannot map ", bytes,
                   " bytes of shared memory: ", detail::errnoText(err));
      }
      init(base, bytes);
      memfdName = detail::str("memfd:", ::getpid(), ":", fd);
    }
    store.set(memfdKey, memfdName);
  } else {
    store.wait({memfdKey}, timeout);
    memfdName = store.getString(memfdKey);
    std::string answer = "no";
    int pid = 0, theirFd = -1;
    if (std::sscanf(memfdName.c_str(), "memfd:%d:%d", &pid, &theirFd) == 2) {
      char path[64];
      std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, theirFd);
      fd = ::open(path, O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        answer = detail::str("no: open ", path, ": ", detail::errnoText(errno));
      } else {
        struct stat st {};
        if (::fstat(fd, &st) == 0) mapBytes = static_cast<size_t>(st.st_size);
        base = mapBytes == bytes ? mapShared(fd, mapBytes) : nullptr;
        ::close(fd);
        fd = -1;
        if (base != nullptr) {
          try {
            check(base, mapBytes);
            answer = "ok";
          } catch (const std::exception& e) {
            answer = detail::str("no: ", e.what());
          }
        } else {
          answer = detail::str("no: cannot map ", bytes, " bytes (", mapBytes, " there)");
        }
        if (answer != "ok" && base != nullptr) {
          ::munmap(base, mapBytes);
          base = nullptr;
        }
      }
    }
    if (memfdName != "none") store.set(detail::str(keyPrefix, "/memfd-ok/", rank), answer);
  }
  if (memfdName != "none") {
    // Every rank reads every answer, so that all take the same decision.
    const std::vector<std::string> keys = peerKeys(keyPrefix + "/memfd-ok/", size);
    bool allOk = true;
    try {
      if (!keys.empty()) {
        store.wait(keys, timeout);
        for (const Bytes& a : store.multiGet(keys)) allOk = allOk && toString(a) == "ok";
      }
    } catch (...) {
      if (fd >= 0) ::close(fd);
      if (base != nullptr) ::munmap(base, mapBytes);
      throw;
    }
    if (fd >= 0) ::close(fd);  // rank 0: the mappings keep the memory alive from now on
    if (allOk) return std::unique_ptr<Segment>(new Segment(base, mapBytes, memfdName));
    if (base != nullptr) ::munmap(base, mapBytes);
    base = nullptr;
  }

  // ---- fallback: a named POSIX segment, unlinked as soon as every rank mapped it ----
  const std::string nameKey = keyPrefix + "/named/name";
  std::string name;
  if (rank == 0) {
    std::random_device rd;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "/loom-shm-%d-%08x%08x", static_cast<int>(::getpid()), rd(),
                  rd());
    name = buf;
    fd =
        LOOM_SYSCHECK(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600), "shm_open ", name);
    if (!reserve(fd, bytes) || (base = mapShared(fd, bytes)) == nullptr) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      LOOM_THROW(IoError, "cannot reserve and map ", bytes, " bytes of shared memory for ", name,
                 ": ", detail::errnoText(err));
    }
    ::close(fd);
    init(base, bytes);
    store.set(nameKey, name);
  } else {
    store.wait({nameKey}, timeout);
    name = store.getString(nameKey);
    fd = LOOM_SYSCHECK(::shm_open(name.c_str(), O_RDWR, 0600), "shm_open ", name,
                       " (created by rank 0)");
    struct stat st {};
    if (::fstat(fd, &st) == 0) mapBytes = static_cast<size_t>(st.st_size);
    base = mapBytes == bytes ? mapShared(fd, mapBytes) : nullptr;
    const int err = errno;
    ::close(fd);
    if (base == nullptr) {
      LOOM_THROW(IoError, "rank ", rank, ": cannot map ", bytes, " bytes of ", name, " (", mapBytes,
                 " there): ", detail::errnoText(err));
    }
    try {
      check(base, mapBytes);
    } catch (...) {
      ::munmap(base, mapBytes);
      throw;
    }
  }
  std::unique_ptr<Segment> segment(new Segment(base, mapBytes, name));
  // Rank 0 removes the name once every rank mapped it (the others go on at once).
  store.set(detail::str(keyPrefix, "/named/mapped/", rank), "1");
  if (rank == 0) {
    try {
      const std::vector<std::string> keys = peerKeys(keyPrefix + "/named/mapped/", size);
      if (!keys.empty()) store.wait(keys, timeout);
    } catch (...) {
      ::shm_unlink(name.c_str());
      throw;
    }
    ::shm_unlink(name.c_str());
  }
  return segment;
}

Segment::~Segment() {
  ::munmap(base_, bytes_);
}

}  // namespace loom::comm::shm
