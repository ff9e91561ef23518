// FileStore: a Store in one file that many processes (on one host or a shared filesystem with
// working flock) open by path.
//
// Contract
// - The file is an append-only log of records, each framed as
//     magic "LFS1" (4) | body length (4) | CRC-32 of body (4) | body
//     body = type (1: set, 2: delete) | key length (4) | key | value
//   (integers big-endian). Every read-modify-write (set, add, compareSet, deleteKey,
//   multiSet) happens under an exclusive flock; readers take a shared flock. Each process
//   keeps a map of the log it has read and reads only what was appended since.
// - A process killed in the middle of a write leaves at most a torn last record: readers stop
//   at the first record that is incomplete or fails its checksum, and the next writer
//   truncates it away (with a warning) before appending. Everything written before survives;
//   values persist in the file after every process exits (they reach the page cache, not
//   necessarily the disk: no fsync).
// - get and wait poll the file (sleeps from 1 ms growing to 20 ms) until the keys exist or
//   the timeout passes; TimeoutError names the keys, the file and the milliseconds waited.
// - A failed write (full disk, I/O error) is an IoError naming the file; the partial record
//   is cut off again so the log stays valid.
// - Thread-safe (an in-process mutex around the flock). A FileStore object copied into a child
//   by fork() reopens the file on first use there, so parent and child lock independently.
// - The log is never compacted; a store for rendezvous stays small.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/store/store.h"

namespace loom {

struct FileStoreOptions {
  milliseconds timeout = Store::kDefaultTimeout;
};

class FileStore : public Store {
 public:
  explicit FileStore(std::string path, const FileStoreOptions& options = {});
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  using Store::set;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  using Store::wait;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

  const std::string& path() const { return path_; }

 private:
  class FileLock;
  struct Record {
    bool erase;
    std::string key;
    Bytes value;
  };

  void openFile();
  void reopenIfForked();  // requires mu_
  // Reads the records appended since the last refresh into data_. Requires mu_ and a flock.
  // Returns the file size, which is larger than offset_ when a torn tail follows.
  uint64_t refreshLocked();
  // Appends records at the end of the valid log and applies them. Requires mu_ and an
  // exclusive flock.
  void appendLocked(const std::vector<Record>& records);
  // Polls until every key exists; returns their values when `read`.
  std::vector<Bytes> waitFor(const std::vector<std::string>& keys, milliseconds timeout, bool read);
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const;

  std::string path_;
  std::mutex mu_;
  int fd_ = -1;
  pid_t pid_ = 0;
  uint64_t offset_ = 0;  // end of the records applied to data_
  std::unordered_map<std::string, Bytes> data_;
};

}  // namespace loom
