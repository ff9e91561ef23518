#include "loom/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "crc32.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store_protocol.h"

namespace loom {
namespace {

constexpr uint32_t kRecordMagic = 0x4C465331;  // "LFS1"
constexpr size_t kRecordHeader = 12;
constexpr uint8_t kTypeSet = 1;
constexpr uint8_t kTypeDelete = 2;
constexpr size_t kMaxBody = size_t{1} << 30;

using store_detail::crc32;

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

uint32_t getU32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "\"" : ", \"") + key + "\"";
  return out;
}

void checkKey(const std::string& key) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  LOOM_CHECK_LE(key.size(), store_protocol::kMaxKeyBytes, "store key is too long");
}

}  // namespace

namespace {

// The processes that hold a flock on the file open at `fd`, from /proc/locks ("1: FLOCK
// ADVISORY WRITE 4242 08:01:1234 0 EOF": the pid, then major:minor:inode, the first two in hex).
// Empty where /proc/locks is unreadable or names none (a lock held on another NFS client).
std::string flockHolders(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  std::ifstream locks("/proc/locks");
  std::string line, holders;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string number, kind, advisory, mode, pid, id;
    if (!(in >> number >> kind) || kind != "FLOCK") continue;
    if (!(in >> advisory >> mode >> pid >> id)) continue;
    unsigned major = 0, minor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(id.c_str(), "%x:%x:%llu", &major, &minor, &inode) != 3) continue;
    if (major != ::major(st.st_dev) || minor != ::minor(st.st_dev) || inode != st.st_ino) continue;
    const bool self = std::to_string(::getpid()) == pid;  // another FileStore of this process
    holders += detail::str(holders.empty() ? "" : ", ", "pid ", pid, " (", mode,
                           self ? ", this process" : "", ")");
  }
  return holders;
}

}  // namespace

// flock for the length of a scope; shared for readers, exclusive for writers. Taken without
// blocking and retried until `deadline`: a holder that stopped (SIGSTOP, a frozen host with the
// file on NFS) makes a TimeoutError naming the holder, not a wait without end.
class FileStore::FileLock {
 public:
  FileLock(int fd, bool exclusive, const std::string& path, const Deadline& deadline) : fd_(fd) {
    milliseconds pause(1);
    for (;;) {
      if (::flock(fd_, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return;
      if (errno == EINTR) continue;
      LOOM_CHECK_T(IoError, errno == EWOULDBLOCK, "flock on FileStore ", path, ": ",
                   detail::errnoText(errno));
      if (deadline.expired()) {
        const std::string holders = flockHolders(fd_);
        LOOM_THROW(TimeoutError, "FileStore ", path, ": could not take its ",
                   exclusive ? "exclusive" : "shared", " file lock in ", deadline.elapsed().count(),
                   " ms: another process holds it",
                   holders.empty() ? " (/proc/locks names no holder on this host)"
                                   : " (holder: " + holders + ")",
                   "; a process stopped or frozen while it holds the lock keeps every rank out");
      }
      std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
      pause = std::min(pause * 2, milliseconds(20));
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, const FileStoreOptions& options) : path_(std::move(path)) {
  LOOM_CHECK(!path_.empty(), "FileStore needs a file path");
  setTimeout(options.timeout);
  openFile();
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::openFile() {
  fd_ = LOOM_SYSCHECK(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644), "open FileStore ",
                      path_);
  pid_ = ::getpid();
}

void FileStore::reopenIfForked() {
  if (::getpid() == pid_) return;
  // The descriptor (and with it the flock) is shared with the parent: take our own.
  ::close(fd_);
  fd_ = -1;
  openFile();
}

uint64_t FileStore::refreshLocked() {
  struct stat st {};
  LOOM_SYSCHECK(::fstat(fd_, &st), "fstat FileStore ", path_);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= offset_) return size;
  std::vector<uint8_t> buf(size - offset_);
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::pread(fd_, buf.data() + got, buf.size() - got, offset_ + got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) LOOM_THROW(IoError, "read FileStore ", path_, ": ", detail::errnoText(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  size_t pos = 0;
  while (got - pos >= kRecordHeader) {
    const uint8_t* h = buf.data() + pos;
    const uint32_t length = getU32(h + 4);
    if (getU32(h) != kRecordMagic || length < 5 || got - pos - kRecordHeader < length) break;
    const uint8_t* body = h + kRecordHeader;
    if (crc32(body, length) != getU32(h + 8)) break;
    const uint32_t keyLen = getU32(body + 1);
    if (keyLen > length - 5) break;
    std::string key(reinterpret_cast<const char*>(body + 5), keyLen);
    if (body[0] == kTypeDelete) {
      data_.erase(key);
    } else {
      data_[key] = Bytes(body + 5 + keyLen, body + length);
    }
    pos += kRecordHeader + length;
  }
  offset_ += pos;
  return size;
}

void FileStore::appendLocked(const std::vector<Record>& records) {
  const uint64_t size = refreshLocked();
  if (size > offset_) {
    LOOM_LOG_WARNING("FileStore ", path_, ": cutting off ", size - offset_,
                     " byte(s) of a torn or corrupt record at offset ", offset_,
                     " (a writer died mid-write?)");
    LOOM_SYSCHECK(::ftruncate(fd_, static_cast<off_t>(offset_)), "truncate FileStore ", path_);
  }
  std::vector<uint8_t> out;
  for (const auto& record : records) {
    const size_t length = 5 + record.key.size() + record.value.size();
    LOOM_CHECK_LE(length, kMaxBody, "FileStore ", path_, ": value for \"", record.key,
                  "\" is too large");
    std::vector<uint8_t> body;
    body.reserve(length);
    body.push_back(record.erase ? kTypeDelete : kTypeSet);
    putU32(body, static_cast<uint32_t>(record.key.size()));
    body.insert(body.end(), record.key.begin(), record.key.end());
    body.insert(body.end(), record.value.begin(), record.value.end());
    putU32(out, kRecordMagic);
    putU32(out, static_cast<uint32_t>(length));
    putU32(out, crc32(body.data(), body.size()));
    out.insert(out.end(), body.begin(), body.end());
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t w = ::pwrite(fd_, out.data() + done, out.size() - done, offset_ + done);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    const int err = w < 0 ? errno : EIO;
    // Leave the log ending at a record boundary; if even that fails, readers skip the tail.
    if (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {
      LOOM_LOG_WARNING("FileStore ", path_,
                       ": cannot cut off a partial write: ", detail::errnoText(errno));
    }
    LOOM_THROW(IoError, "write to FileStore ", path_, " failed after ", done, " of ", out.size(),
               " bytes: ", detail::errnoText(err));
  }
  offset_ += out.size();
  for (const auto& record : records) {
    if (record.erase) {
      data_.erase(record.key);
    } else {
      data_[record.key] = record.value;
    }
  }
}

std::vector<std::string> FileStore::missingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

void FileStore::set(const std::string& key, const Bytes& value) {
  checkKey(key);
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, true, path_, Deadline(timeout()));
  appendLocked({Record{false, key, value}});
}

Bytes FileStore::get(const std::string& key) {
  return multiGet({key})[0];
}

std::vector<Bytes> FileStore::multiGet(const std::vector<std::string>& keys) {
  return waitFor(keys, timeout(), /*read=*/true);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  checkKey(key);
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, true, path_, Deadline(timeout()));
  refreshLocked();
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    LOOM_CHECK(store_protocol::parseInt64(it->second, current), "add(\"", key,
               "\"): the key holds a value that is not a decimal integer");
  }
  int64_t result = 0;
  LOOM_CHECK(!__builtin_add_overflow(current, delta, &result), "add(\"", key, "\", ", delta,
             "): overflows int64 (current ", current, ")");
  appendLocked({Record{false, key, toBytes(std::to_string(result))}});
  return result;
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkKey(key);
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, true, path_, Deadline(timeout()));
  refreshLocked();
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;
    appendLocked({Record{false, key, desired}});
    return desired;
  }
  if (it->second != expected) return it->second;
  appendLocked({Record{false, key, desired}});
  return desired;
}

bool FileStore::deleteKey(const std::string& key) {
  checkKey(key);
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, true, path_, Deadline(timeout()));
  refreshLocked();
  if (data_.count(key) == 0) return false;
  appendLocked({Record{true, key, {}}});
  return true;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) checkKey(key);
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, false, path_, Deadline(timeout()));
  refreshLocked();
  return missingLocked(keys).empty();
}

void FileStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  waitFor(keys, timeout, /*read=*/false);
}

std::vector<Bytes> FileStore::waitFor(const std::vector<std::string>& keys, milliseconds timeout,
                                      bool read) {
  for (const auto& key : keys) checkKey(key);
  Deadline deadline(timeout);
  milliseconds pause(1);
  for (;;) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> guard(mu_);
      reopenIfForked();
      FileLock lock(fd_, false, path_, deadline);
      refreshLocked();
      missing = missingLocked(keys);
      if (missing.empty()) {
        std::vector<Bytes> values;
        if (read) {
          values.reserve(keys.size());
          for (const auto& key : keys) values.push_back(data_.at(key));
        }
        return values;
      }
    }
    if (deadline.expired()) {
      LOOM_THROW(TimeoutError, "FileStore ", path_, ": ", read ? "get" : "wait",
                 " timed out after ", deadline.elapsed().count(), " ms waiting for key(s) ",
                 quoteKeys(missing));
    }
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min(pause * 2, milliseconds(20));
  }
}

int64_t FileStore::numKeys() {
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, false, path_, Deadline(timeout()));
  refreshLocked();
  return static_cast<int64_t>(data_.size());
}

void FileStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  LOOM_CHECK_EQ(keys.size(), values.size(), "multiSet needs one value per key");
  std::vector<Record> records;
  records.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    checkKey(keys[i]);
    records.push_back(Record{false, keys[i], values[i]});
  }
  std::lock_guard<std::mutex> guard(mu_);
  reopenIfForked();
  FileLock lock(fd_, true, path_, Deadline(timeout()));
  appendLocked(records);
}

}  // namespace loom
