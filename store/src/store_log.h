// StoreLog: a TCPStore server's keys on disk, so that a restarted server starts with them.
//
// Layout, in one directory that only this server uses (an exclusive flock on <dir>/lock):
//   snapshot.<N>   every key at the moment log N began (absent for N = 0)
//   log.<N>        the changes since, one record per request, appended in apply order
// A record is `magic "LSL1" | body length u32 | CRC-32 of body u32 | body`, body =
// `count u32, then per change: type u8 (1 set, 2 delete), key length u32, key,
// [value length u64, value]`. All the changes of one request (a multiSet) are one record, so a
// restart sees all of them or none.
//
// Durability (the fsync policy):
// - kAlways: the record is written and fdatasync'ed before the request is answered, so what a
//   client was told is stored survives the server process dying and the machine losing power.
// - kNever: the record is written (to the page cache) before the answer: it survives the
//   server process being killed, not a machine crash.
// A write or fsync that fails (a full disk: ENOSPC, EDQUOT, EIO) cuts the log back to its last
// whole record and throws IoError naming the file, the offset and the error; the server then
// refuses the request (nothing is applied in memory either), so what is on disk and what
// clients were told never differ. When the cut back itself fails, the log is broken (a partial
// record may sit at its end, and a restart drops everything after it): every later append
// throws IoError naming the original failure, so no change is acknowledged that a restart would
// drop (fail-stop; restarting the server cuts the torn tail and serves again).
//
// Loading: snapshot.<N> of the highest N (a corrupt snapshot is an error: it was fsync'ed and
// renamed into place whole, so damage there is not a torn write), then log.<N>. A log whose
// last record is torn or fails its CRC (the server died mid-write) is cut at that record's
// offset, with a warning naming the file, the offset and the bytes dropped.
//
// Compaction: when the log passes compactBytes and is larger than the last snapshot, the
// server writes snapshot.<N+1>.tmp, fsyncs it, renames it into place, starts an empty
// log.<N+1>, fsyncs the directory and only then deletes generation N. A crash at any point
// leaves either generation N whole or generation N+1 whole. A compaction that fails (a full
// disk) is logged and abandoned; the log goes on growing and nothing is lost.
//
// Not thread-safe: the server's loop thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/store/store.h"
#include "loom/store/tcp_store_server.h"

namespace loom {

struct StoreLogOptions {
  std::string dir;
  StoreFsync fsync = StoreFsync::kAlways;
  uint64_t compactBytes = uint64_t{64} << 20;
  // Test seam (store_persistence_test), empty otherwise: called before each step of an append,
  // "write", "fdatasync" and "cut" (the cut back after a failure), with the log's descriptor; a
  // nonzero return is the errno that step fails with, without running it.
  std::function<int(const char* step, int fd)> faultForTest;
};

class StoreLog {
 public:
  struct Change {
    std::string key;
    std::optional<Bytes> value;  // nullopt: the key is deleted
  };
  struct Loaded {
    uint64_t keys = 0;
    uint64_t records = 0;       // log records replayed
    uint64_t droppedBytes = 0;  // a torn tail cut off
  };

  // Opens (creating the directory), loads what is there into `data` (which must be empty) and
  // makes the log ready for appends. IoError when the directory cannot be used or is locked
  // by another server; a corrupt snapshot is an IoError naming it.
  StoreLog(const StoreLogOptions& options, std::unordered_map<std::string, Bytes>& data);
  ~StoreLog();
  StoreLog(const StoreLog&) = delete;
  StoreLog& operator=(const StoreLog&) = delete;

  // Appends one record holding `changes`, durable per the fsync policy. IoError on failure,
  // with the log cut back so that the record is absent; IoError, and nothing written, once a
  // cut back has failed (broken()).
  void append(const std::vector<Change>& changes);
  // Compacts when the log has grown past compactBytes and past the last snapshot's size.
  void maybeCompact(const std::unordered_map<std::string, Bytes>& data);

  const Loaded& loaded() const { return loaded_; }
  const std::string& dir() const { return options_.dir; }
  uint64_t generation() const { return gen_; }
  uint64_t logBytes() const { return logBytes_; }
  // Why the log refuses every change ("" while it does not): a cut back that failed.
  const std::string& broken() const { return broken_; }

 private:
  std::string path(const char* kind, uint64_t gen) const;
  void openLog();
  void compact(const std::unordered_map<std::string, Bytes>& data);

  StoreLogOptions options_;
  int lockFd_ = -1;
  int logFd_ = -1;
  uint64_t gen_ = 0;
  uint64_t logBytes_ = 0;
  uint64_t snapshotBytes_ = 0;
  Loaded loaded_;
  std::string broken_;
};

}  // namespace loom
