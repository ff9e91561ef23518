#include "store_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "crc32.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom {
namespace {

using store_detail::crc32;

constexpr uint32_t kMagic = 0x4C534C31;  // "LSL1"
constexpr size_t kHeader = 12;
constexpr uint8_t kSet = 1;
constexpr uint8_t kDelete = 2;
// A body larger than this is not a record of ours (a multiSet is bounded by the protocol's
// 130 MiB payload): a length past it means the header itself is damaged.
constexpr uint64_t kMaxBody = uint64_t{1} << 30;

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}
void putU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}
uint32_t getU32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint64_t getU64(const uint8_t* p) {
  return (uint64_t{getU32(p)} << 32) | getU32(p + 4);
}

std::vector<uint8_t> encodeRecord(const std::vector<StoreLog::Change>& changes) {
  std::vector<uint8_t> out(kHeader);
  putU32(out, static_cast<uint32_t>(changes.size()));
  for (const auto& c : changes) {
    out.push_back(c.value ? kSet : kDelete);
    putU32(out, static_cast<uint32_t>(c.key.size()));
    out.insert(out.end(), c.key.begin(), c.key.end());
    if (c.value) {
      putU64(out, c.value->size());
      out.insert(out.end(), c.value->begin(), c.value->end());
    }
  }
  const size_t body = out.size() - kHeader;
  std::vector<uint8_t> head;
  putU32(head, kMagic);
  putU32(head, static_cast<uint32_t>(body));
  putU32(head, crc32(out.data() + kHeader, body));
  std::copy(head.begin(), head.end(), out.begin());
  return out;
}

// Applies one record's body to `data`; false when the body does not parse (a damaged record
// whose CRC happened to match is not worth distinguishing: both mean "stop here").
bool applyBody(const uint8_t* p, size_t n, std::unordered_map<std::string, Bytes>& data) {
  if (n < 4) return false;
  const uint32_t count = getU32(p);
  size_t at = 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (n - at < 5) return false;
    const uint8_t type = p[at];
    const uint32_t keyLen = getU32(p + at + 1);
    at += 5;
    if (n - at < keyLen) return false;
    std::string key(reinterpret_cast<const char*>(p + at), keyLen);
    at += keyLen;
    if (type == kDelete) {
      data.erase(key);
      continue;
    }
    if (type != kSet || n - at < 8) return false;
    const uint64_t valueLen = getU64(p + at);
    at += 8;
    if (n - at < valueLen) return false;
    data.insert_or_assign(std::move(key), Bytes(p + at, p + at + valueLen));
    at += valueLen;
  }
  return at == n;
}

struct Replay {
  uint64_t records = 0;
  uint64_t goodBytes = 0;  // offset just past the last whole record
  std::string damage;      // why the bytes after goodBytes were not used
};

// Applies every whole record of `bytes` in order; stops at the first that is torn or damaged.
Replay replay(const std::vector<uint8_t>& bytes, std::unordered_map<std::string, Bytes>& data) {
  Replay r;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t left = bytes.size() - at;
    if (left < kHeader) {
      r.damage = detail::str("a record header cut short (", left, " of ", kHeader, " bytes)");
      break;
    }
    const uint8_t* h = bytes.data() + at;
    if (getU32(h) != kMagic) {
      r.damage = "bytes that are not a record (wrong magic)";
      break;
    }
    const uint64_t body = getU32(h + 4);
    if (body > kMaxBody) {
      r.damage = detail::str("a record header claiming ", body, " bytes");
      break;
    }
    if (left - kHeader < body) {
      r.damage = detail::str("a record cut short (", left - kHeader, " of ", body, " bytes)");
      break;
    }
    if (crc32(h + kHeader, body) != getU32(h + 8)) {
      r.damage = "a record whose CRC does not match";
      break;
    }
    // A CRC-valid body that does not parse was written by another program; stop there.
    if (!applyBody(h + kHeader, body, data)) {
      r.damage = "a record whose body does not parse";
      break;
    }
    at += kHeader + body;
    r.goodBytes = at;
    ++r.records;
  }
  return r;
}

std::vector<uint8_t> readAll(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) LOOM_THROW(IoError, "store log: cannot open ", path, ": ", detail::errnoText(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      LOOM_THROW(IoError, "store log: cannot read ", path, ": ", detail::errnoText(err));
    }
    if (r == 0) break;
    out.insert(out.end(), buf, buf + r);
  }
  ::close(fd);
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Writes all of `data` at the file's current offset; errno on failure, 0 on success.
int writeAll(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

void syncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

StoreLog::StoreLog(const StoreLogOptions& options, std::unordered_map<std::string, Bytes>& data)
    : options_(options) {
  LOOM_CHECK(!options_.dir.empty(), "StoreLog needs a directory");
  LOOM_CHECK(data.empty(), "StoreLog loads into an empty key map");
  if (::mkdir(options_.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    LOOM_THROW(IoError, "store log: cannot create directory ", options_.dir, ": ",
               detail::errnoText(errno));
  }
  const std::string lock = options_.dir + "/lock";
  lockFd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lockFd_ < 0) {
    LOOM_THROW(IoError, "store log: cannot open ", lock, ": ", detail::errnoText(errno));
  }
  if (::flock(lockFd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lockFd_);
    lockFd_ = -1;
    LOOM_THROW(IoError, "store log: directory ", options_.dir,
               " is in use by another store server (", lock, " is locked: ", detail::errnoText(err),
               "); give each server its own directory");
  }

  // The newest generation that has a snapshot; generation 0 has none.
  std::vector<uint64_t> gens;
  if (DIR* d = ::opendir(options_.dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      for (const char* kind : {"snapshot.", "log."}) {
        const std::string prefix = kind;
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string rest = name.substr(prefix.size());
        if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) {
          if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, ".tmp") == 0) {
            ::unlink((options_.dir + "/" + name).c_str());  // a compaction that never finished
          }
          continue;
        }
        gens.push_back(std::stoull(rest));
      }
    }
    ::closedir(d);
  }
  for (uint64_t g : gens) {
    if (g > gen_ && exists(path("snapshot", g))) gen_ = g;
  }
  if (gen_ > 0) {
    const std::string snap = path("snapshot", gen_);
    const std::vector<uint8_t> bytes = readAll(snap);
    const Replay r = replay(bytes, data);
    if (!r.damage.empty()) {
      LOOM_THROW(IoError, "store log: snapshot ", snap, " is damaged at offset ", r.goodBytes, " (",
                 r.damage, "); it was written whole, so this is not a torn write: ",
                 "refusing to start with part of the keys");
    }
    snapshotBytes_ = bytes.size();
  }
  const std::string log = path("log", gen_);
  if (exists(log)) {
    const std::vector<uint8_t> bytes = readAll(log);
    const Replay r = replay(bytes, data);
    loaded_.records = r.records;
    if (!r.damage.empty()) {
      loaded_.droppedBytes = bytes.size() - r.goodBytes;
      LOOM_LOG_WARNING("store log ", log, ": dropped ", loaded_.droppedBytes, " byte(s) at offset ",
                       r.goodBytes, " (", r.damage,
                       "; the server stopped in the middle of a write); the ", r.records,
                       " record(s) before it are kept");
      if (::truncate(log.c_str(), static_cast<off_t>(r.goodBytes)) != 0) {
        LOOM_THROW(IoError, "store log: cannot cut the torn tail of ", log, " at offset ",
                   r.goodBytes, ": ", detail::errnoText(errno));
      }
    }
  }
  // Older generations are left only by a crash between a compaction's last two steps.
  for (uint64_t g : gens) {
    if (g == gen_) continue;
    ::unlink(path("snapshot", g).c_str());
    ::unlink(path("log", g).c_str());
  }
  loaded_.keys = data.size();
  openLog();
  // A log file that was just created is only durable once its directory entry is.
  if (options_.fsync == StoreFsync::kAlways) syncDir(options_.dir);
}

StoreLog::~StoreLog() {
  if (logFd_ >= 0) ::close(logFd_);
  if (lockFd_ >= 0) ::close(lockFd_);  // releases the flock
}

std::string StoreLog::path(const char* kind, uint64_t gen) const {
  return options_.dir + "/" + kind + "." + std::to_string(gen);
}

void StoreLog::openLog() {
  const std::string log = path("log", gen_);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) LOOM_THROW(IoError, "store log: cannot open ", log, ": ", detail::errnoText(errno));
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) {
    const int err = errno;
    ::close(fd);
    LOOM_THROW(IoError, "store log: cannot seek in ", log, ": ", detail::errnoText(err));
  }
  if (logFd_ >= 0) ::close(logFd_);
  logFd_ = fd;
  logBytes_ = static_cast<uint64_t>(end);
}

void StoreLog::append(const std::vector<Change>& changes) {
  if (changes.empty()) return;
  if (!broken_.empty()) {
    LOOM_THROW(IoError, "store log ", path("log", gen_), " is broken: ", broken_,
               "; every change is refused until the server restarts (a restart cuts the torn "
               "record and serves again); the change was not stored");
  }
  auto fault = [&](const char* step) {
    return options_.faultForTest ? options_.faultForTest(step, logFd_) : 0;
  };
  const std::vector<uint8_t> record = encodeRecord(changes);
  int err = fault("write");
  if (err == 0) err = writeAll(logFd_, record.data(), record.size());
  const char* step = "write";
  if (err == 0 && options_.fsync == StoreFsync::kAlways) {
    step = "fdatasync";
    err = fault(step);
    if (err == 0 && ::fdatasync(logFd_) != 0) err = errno;
  }
  if (err != 0) {
    const std::string failure =
        detail::str(step, " of a ", record.size(), "-byte record at offset ", logBytes_,
                    " failed: ", detail::errnoText(err));
    // Cut back to the last whole record so that the log never holds what was refused.
    int cutErr = fault("cut");
    if (cutErr == 0 && (::ftruncate(logFd_, static_cast<off_t>(logBytes_)) != 0 ||
                        ::lseek(logFd_, static_cast<off_t>(logBytes_), SEEK_SET) < 0)) {
      cutErr = errno;
    }
    if (cutErr != 0) {
      // Records appended after a partial one would be acknowledged, then dropped by the next
      // replay (it stops at the torn record): refuse every later change instead.
      broken_ = detail::str(failure, ", and cutting it back to offset ", logBytes_,
                            " failed: ", detail::errnoText(cutErr));
      LOOM_LOG_ERROR("store log ", path("log", gen_), ": ", broken_,
                     "; refusing every change until the server restarts");
      LOOM_THROW(IoError, "store log ", path("log", gen_), ": ", broken_,
                 "; the change was not stored, and the store refuses every change until the "
                 "server restarts");
    }
    LOOM_THROW(IoError, "store log ", path("log", gen_), ": ", failure,
               "; the change was not stored");
  }
  logBytes_ += record.size();
}

void StoreLog::maybeCompact(const std::unordered_map<std::string, Bytes>& data) {
  if (!broken_.empty()) return;  // nothing is appended any more
  if (logBytes_ < options_.compactBytes || logBytes_ < snapshotBytes_) return;
  try {
    compact(data);
  } catch (const std::exception& e) {
    LOOM_LOG_WARNING("store log ", options_.dir,
                     ": compaction abandoned, the log keeps growing: ", e.what());
  }
}

void StoreLog::compact(const std::unordered_map<std::string, Bytes>& data) {
  const uint64_t next = gen_ + 1;
  const std::string snap = path("snapshot", next);
  const std::string tmp = snap + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) LOOM_THROW(IoError, "cannot create ", tmp, ": ", detail::errnoText(errno));
  uint64_t written = 0;
  int err = 0;
  for (const auto& [key, value] : data) {
    const std::vector<uint8_t> record = encodeRecord({Change{key, value}});
    if ((err = writeAll(fd, record.data(), record.size())) != 0) break;
    written += record.size();
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (err != 0) {
    ::unlink(tmp.c_str());
    LOOM_THROW(IoError, "cannot write ", tmp, ": ", detail::errnoText(err));
  }
  // The new log exists (empty) before the snapshot is renamed into place: a loader that sees
  // snapshot.<next> always finds its log, and one that sees only log.<next> ignores it.
  const std::string nextLog = path("log", next);
  const int logFd = ::open(nextLog.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (logFd < 0) {
    err = errno;
    ::unlink(tmp.c_str());
    LOOM_THROW(IoError, "cannot create ", nextLog, ": ", detail::errnoText(err));
  }
  if (::rename(tmp.c_str(), snap.c_str()) != 0) {
    err = errno;
    ::close(logFd);
    ::unlink(tmp.c_str());
    ::unlink(nextLog.c_str());
    LOOM_THROW(IoError, "cannot rename ", tmp, ": ", detail::errnoText(err));
  }
  syncDir(options_.dir);
  const uint64_t old = gen_;
  ::close(logFd_);
  logFd_ = logFd;
  logBytes_ = 0;
  gen_ = next;
  ::unlink(path("snapshot", old).c_str());
  ::unlink(path("log", old).c_str());
  snapshotBytes_ = written;
  LOOM_LOG_INFO("store log ", options_.dir, ": compacted ", data.size(), " key(s) into ", snap,
                " (", written, " bytes)");
}

}  // namespace loom
