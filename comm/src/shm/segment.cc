#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/logging.h"
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

// A rank's memfd answer when the memory maps but its layout is not this rank's.
constexpr const char* kMismatch = "mismatch: ";

std::vector<std::string> peerKeys(const std::string& prefix, int size) {
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(detail::str(prefix, r));
  return keys;
}

}  // namespace

int sweepStaleNamedSegments(std::chrono::seconds minAge) {
  // Names are "/loom-shm-<pid of rank 0>-<random>" (below); in /dev/shm without the slash.
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(dir)) {
    int pid = 0;
    char rest[64];
    if (std::sscanf(e->d_name, "loom-shm-%d-%63s", &pid, rest) != 2 || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge (EPERM)
    struct stat st {};
    const std::string path = std::string("/dev/shm/") + e->d_name;
    if (::stat(path.c_str(), &st) != 0 || now - st.st_mtime < minAge.count()) continue;
    if (::shm_unlink((std::string("/") + e->d_name).c_str()) == 0) {
      LOOM_LOG_WARNING("removed /dev/shm/", e->d_name, " (", st.st_size,
                       " bytes): a shared-memory segment whose creator, pid ", pid,
                       ", is gone; a job killed during its setup left it");
      ++removed;
    }
  }
  ::closedir(dir);
  return removed;
}

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
        // Mapped at the size rank 0 made it, so that `check` sees a layout that differs from
        // this rank's (its message names the settings to compare) instead of a failed mmap.
        struct stat st {};
        if (::fstat(fd, &st) == 0) mapBytes = static_cast<size_t>(st.st_size);
        base = mapBytes > 0 ? mapShared(fd, mapBytes) : nullptr;
        const int err = errno;
        ::close(fd);
        fd = -1;
        if (base != nullptr) {
          try {
            check(base, mapBytes);
            answer = "ok";
          } catch (const std::exception& e) {
            // The memory is shared fine; the ranks disagree on its layout, which the named
            // segment would not cure: every rank fails with this.
            answer = detail::str(kMismatch, e.what());
          }
        } else {
          answer = detail::str("no: cannot map ", mapBytes, " bytes: ", detail::errnoText(err));
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
    std::string mismatch;
    try {
      if (!keys.empty()) {
        store.wait(keys, timeout);
        for (const Bytes& a : store.multiGet(keys)) {
          const std::string answer = toString(a);
          allOk = allOk && answer == "ok";
          if (mismatch.empty() && answer.rfind(kMismatch, 0) == 0) {
            mismatch = answer.substr(std::strlen(kMismatch));
          }
        }
      }
      if (!mismatch.empty()) LOOM_THROW(IoError, mismatch);  // check's own "rank N: ..."
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

  // ---- fallback: a named POSIX segment, unlinked by the last rank to open it ----
  const std::string nameKey = keyPrefix + "/named/name";
  std::string name;
  if (rank == 0) {
    sweepStaleNamedSegments(kStaleNamedSegmentAge);
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
    // From here the Segment owns the mapping and, until the name is gone, the name: every
    // failure of rank 0 (a store error, or a later step of the group's setup that throws)
    // unlinks it on the way out.
    std::unique_ptr<Segment> segment(new Segment(base, bytes, name));
    segment->unlinkOnDestroy_ = true;
    store.set(nameKey, name);
    if (size == 1) {
      ::shm_unlink(name.c_str());
      segment->unlinkOnDestroy_ = false;
    }
    // Rank 0 does not wait for the others: a wait here is where a launcher's SIGTERM (after
    // another rank failed) found it, and the name outlived the job.
    return segment;
  }
  store.wait({nameKey}, timeout);
  name = store.getString(nameKey);
  fd = LOOM_SYSCHECK(::shm_open(name.c_str(), O_RDWR, 0600), "shm_open ", name,
                     " (created by rank 0)");
  // The last of the size - 1 ranks to open the name removes it: the open descriptors keep the
  // memory, and nobody holds a name that a kill could leave behind.
  try {
    if (store.add(keyPrefix + "/named/opened", 1) == size - 1) ::shm_unlink(name.c_str());
  } catch (...) {
    ::close(fd);
    throw;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0) mapBytes = static_cast<size_t>(st.st_size);
  base = mapBytes > 0 ? mapShared(fd, mapBytes) : nullptr;
  const int err = errno;
  ::close(fd);
  if (base == nullptr) {
    LOOM_THROW(IoError, "rank ", rank, ": cannot map ", mapBytes, " bytes of ", name, ": ",
               detail::errnoText(err));
  }
  try {
    check(base, mapBytes);  // a layout that differs from this rank's: its message says which
  } catch (...) {
    ::munmap(base, mapBytes);
    throw;
  }
  return std::unique_ptr<Segment>(new Segment(base, mapBytes, name));
}

Segment::~Segment() {
  ::munmap(base_, bytes_);
  if (unlinkOnDestroy_) ::shm_unlink(name_.c_str());  // ENOENT once the last opener removed it
}

}  // namespace loom::comm::shm
