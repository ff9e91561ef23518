#include "diagnostics/group_diagnostics.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "diagnostics/group_diagnostics_core.h"
#include "diagnostics/other_groups.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/socket.h"
#include "loom/store/store.h"

namespace loom::diag {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A listener's single wait on the store; it loops (a TCPStore wait is answered by the server).
constexpr milliseconds kListenerWait{60000};

std::string ringKey(int rank) {
  return "flight/" + std::to_string(rank);
}
std::string failureRingKey(int rank) {
  return "flight/failure/" + std::to_string(rank);
}
constexpr const char* kRequestedKey = "flight/requested";
constexpr const char* kAnalysisKey = "flight/analysis";

std::string pidNamespace() {
  char buf[128];
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

void GroupDiagnostics::Core::beat() {
  Heartbeat hb;
  hb.timeUs = clockUs();
  hb.clockOffsetUs = clockOffsetUs.load(std::memory_order_relaxed);
  hb.clockErrorUs = clockErrorUs.load(std::memory_order_relaxed);
  hb.pid = ::getpid();
  hb.beat = ++beats;
  hb.lastSeq = recorder.lastSeq();
  hb.recorded = recorder.recorded();
  hb.intervalMs = heartbeatInterval.count();
  hb.host = host;
  hb.pidNs = pidNamespace();
  store->set(heartbeatKey(id.rank), hb.text());
}

RankDump GroupDiagnostics::Core::snapshot(const std::string& reason) const {
  RankDump d;
  d.rank = id.rank;
  d.size = id.size;
  d.group = id.group;
  d.parentRanks = id.parentRanks;
  d.backend = id.backend;
  d.host = host;
  d.pid = ::getpid();
  d.reason = reason;
  d.entries = recorder.snapshot();
  if (clockSkewUs != 0) {
    for (OpRecord& r : d.entries) {
      for (int64_t* t : {&r.issueUs, &r.startUs, &r.endUs}) {
        if (*t != 0) *t += clockSkewUs;
      }
    }
  }
  d.timeUs = clockUs();
  d.clockOffsetUs = clockOffsetUs.load(std::memory_order_relaxed);
  d.clockErrorUs = clockErrorUs.load(std::memory_order_relaxed);
  d.capacity = recorder.capacity();
  d.recorded = recorder.recorded();
  d.lastSeq = recorder.lastSeq();
  d.otherGroups = otherGroups(*this, liveGroups());
  return d;
}

std::string GroupDiagnostics::Core::dumpLocal(const std::string& reason, size_t maxEntries) {
  RankDump d = snapshot(reason);
  std::string json = toJson(d);
  if (!dumpDir.empty()) writeFile(json);
  if (d.entries.size() <= maxEntries) return json;
  d.entries.erase(d.entries.begin(), d.entries.end() - static_cast<ptrdiff_t>(maxEntries));
  return toJson(d);
}

void GroupDiagnostics::Core::writeFile(const std::string& json) const {
  const std::string name = dumpDir + "/loom-flight-" + (id.group.empty() ? "default" : id.group) +
                           "-rank" + std::to_string(id.rank) + ".json";
  std::string safe = name;
  // A subgroup's name holds '/' ("group/2"): keep the file in dumpDir.
  for (size_t i = dumpDir.size() + 1; i < safe.size(); ++i) {
    if (safe[i] == '/') safe[i] = '_';
  }
  const std::string tmp = safe + ".tmp" + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(tmp.c_str(), safe.c_str()) == 0;
  if (!ok) {
    LOOM_LOG_WARNING("rank ", id.rank, ": could not write the flight record to ", safe, ": ",
                     std::strerror(errno));
    std::remove(tmp.c_str());
  } else {
    LOOM_LOG_INFO("rank ", id.rank, ": flight record written to ", safe);
  }
}

std::string GroupDiagnostics::Core::dump(const std::string& reason) {
  if (reason == "failure") {
    std::string json = dumpLocal(reason, kFailureEntries);
    store->set(failureRingKey(id.rank), json);
    return json;
  }
  std::string json = dumpLocal(reason, SIZE_MAX);
  store->set(ringKey(id.rank), json);
  return json;
}

namespace {

// ---- SIGUSR1: a byte on a pipe, read by one process-wide thread ----

std::atomic<int> gSignalPipe{-1};  // write end, read by the handler

void onSigusr1(int) {
  const int saved = errno;
  const int fd = gSignalPipe.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

struct SignalRegistry {
  std::mutex mu;
  std::vector<std::weak_ptr<GroupDiagnostics::Core>> groups;
  pid_t watcherPid = -1;  // the process whose thread reads the pipe (a fork child starts its own)
};

SignalRegistry& registry() {
  static SignalRegistry* r = new SignalRegistry;  // never destroyed: the watcher outlives main
  return *r;
}

}  // namespace

std::vector<std::shared_ptr<GroupDiagnostics::Core>> liveGroups() {
  std::vector<std::shared_ptr<GroupDiagnostics::Core>> live;
  std::lock_guard<std::mutex> lock(registry().mu);
  for (const auto& w : registry().groups) {
    auto core = w.lock();
    if (!core) continue;
    // A group that is leaving (or whose construction failed) is gone to its user; a thread of
    // it may still hold it for a while (a listener's wait, a leaver on a store that does not
    // answer).
    {
      std::lock_guard<std::mutex> coreLock(core->mu);
      if (core->stopping) continue;
    }
    live.push_back(std::move(core));
  }
  return live;
}

namespace {

void watch(int readFd) {
  for (;;) {
    char buf[64];
    const ssize_t n = ::read(readFd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (const auto& core : liveGroups()) {
      try {
        core->dump("SIGUSR1");
      } catch (const std::exception& e) {
        LOOM_LOG_WARNING("rank ", core->id.rank, ": SIGUSR1 dump: ", e.what());
      }
    }
  }
}

// Registers `core` for SIGUSR1 dumps; the first call in a process installs the handler (when
// SIGUSR1 has its default disposition) and starts the watcher.
void registerForSignal(const std::shared_ptr<GroupDiagnostics::Core>& core) {
  SignalRegistry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase_if(reg.groups, [](const auto& w) { return w.expired(); });
  reg.groups.push_back(core);
  if (reg.watcherPid == ::getpid()) return;
  struct sigaction current {};
  if (::sigaction(SIGUSR1, nullptr, &current) != 0) return;
  const bool ours = current.sa_handler == onSigusr1;
  if (!ours && current.sa_handler != SIG_DFL) return;  // the program handles SIGUSR1 itself
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // a full pipe drops signals, never blocks the handler
  try {
    std::thread(watch, fds[0]).detach();
  } catch (const std::exception& e) {
    LOOM_LOG_WARNING("no thread for SIGUSR1 dumps: ", e.what());
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  const int old = gSignalPipe.exchange(fds[1]);
  if (old >= 0) ::close(old);  // a fork child drops its parent's pipe
  reg.watcherPid = ::getpid();
  if (!ours) {
    struct sigaction action {};
    action.sa_handler = onSigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &action, nullptr);
  }
}

// The listener: answers dump requests until it reads the stop request.
// `served`: the requests this rank's key counted before the listener started (an earlier group
// on the same store), which are not its own.
void listen(std::shared_ptr<GroupDiagnostics::Core> core, int64_t served) {
  try {
    for (;;) {
      const std::string key = requestKey(core->id.rank, served + 1);
      try {
        core->store->wait({key}, kListenerWait);
      } catch (const TimeoutError&) {
        // The stop request is posted through the store; a group whose construction failed
        // never posts it, and says so here.
        std::lock_guard<std::mutex> lock(core->mu);
        if (core->stopping) break;
        continue;
      }
      const int64_t woke = core->clockUs();  // t1 of a clock request
      ++served;
      const std::string reason = core->store->getString(key);
      if (reason == kStopReason) break;
      if (reason.rfind(kClockReason, 0) == 0) {
        answerClock(*core, reason, woke);
        continue;
      }
      core->dump(reason);
    }
  } catch (const std::exception& e) {
    // The store failed (its host died): no more requests can arrive.
    LOOM_LOG_INFO("rank ", core->id.rank, ": flight record listener stops: ", e.what());
  }
  {
    std::lock_guard<std::mutex> lock(core->mu);
    core->listenerDone = true;
  }
  core->finished.notify_all();
}

// The heartbeat: one beat per interval until the group goes or the store is gone. On ranks
// other than 0 it also starts the clock estimate's rounds: at start, at every beat until one
// succeeded, then every kClockRefreshBeats beats.
void heartbeat(std::shared_ptr<GroupDiagnostics::Core> core) {
  // Whichever way it returns, leave() learns that the heartbeat no longer uses the store.
  struct Done {
    GroupDiagnostics::Core& core;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(core.mu);
        core.heartbeatDone = true;
      }
      core.finished.notify_all();
    }
  } done{*core};
  const bool estimates = core->id.rank != 0 && core->id.size > 1;
  uint64_t sinceRound = 0;
  for (;;) {
    if (estimates && (!core->clockEstimated.load() || sinceRound >= kClockRefreshBeats) &&
        !core->clockRoundRunning.exchange(true)) {
      sinceRound = 0;
      try {
        std::thread(clockRound, core).detach();
      } catch (const std::exception& e) {
        core->clockRoundRunning.store(false);
        LOOM_LOG_INFO("rank ", core->id.rank, ": no thread for the clock estimate: ", e.what());
      }
    }
    {
      std::unique_lock<std::mutex> lock(core->mu);
      if (core->finished.wait_for(lock, core->heartbeatInterval, [&] { return core->stopping; })) {
        return;
      }
    }
    ++sinceRound;
    try {
      core->beat();
    } catch (const TimeoutError&) {
      // A slow store: the next beat tries again.
    } catch (const std::exception& e) {
      LOOM_LOG_INFO("rank ", core->id.rank, ": heartbeat stops: ", e.what());
      return;
    }
  }
}

}  // namespace

GroupDiagnostics::GroupDiagnostics(Identity identity, std::shared_ptr<Store> store, size_t entries,
                                   comm::Algorithm algorithm, std::string dumpDir,
                                   milliseconds heartbeatInterval, int64_t clockSkewUs)
    : core_(std::make_shared<Core>(std::move(identity), std::move(store), entries, algorithm,
                                   std::move(dumpDir), heartbeatInterval, clockSkewUs)) {
  LOOM_CHECK(heartbeatInterval.count() >= 0, "heartbeatInterval must be >= 0 ms, got ",
             heartbeatInterval.count());
  registerForSignal(core_);
  const int64_t served = core_->store->add(requestCountKey(core_->id.rank), 0);
  std::thread(listen, core_, served).detach();
  try {
    // Clock requests posted from now on are answered (posted before, they are an earlier
    // group's to the listener, and time out: the rank asks again).
    if (core_->id.rank == 0 && core_->id.size > 1 && heartbeatInterval.count() > 0) {
      core_->store->set(kClockReadyKey, "1");
    }
    // The first beat, even with heartbeats off: the analysis can then still look at this
    // rank's process when it is on the same host.
    core_->beat();
    announceStoreHost(*core_);
    if (heartbeatInterval.count() > 0) {
      core_->heartbeatDone = false;  // before the thread exists: nothing else reads it yet
      try {
        std::thread(heartbeat, core_).detach();
      } catch (...) {
        core_->heartbeatDone = true;
        throw;
      }
    }
  } catch (...) {
    // No destructor runs: the listener, which holds the store, ends at its next wait's end.
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->stopping = true;
    }
    core_->finished.notify_all();
    throw;
  }
}

GroupDiagnostics::~GroupDiagnostics() {
  leaveGroup(core_, milliseconds(0));
}

void GroupDiagnostics::leave(milliseconds wait) {
  leaveGroup(core_, wait);
}

FlightRecorder& GroupDiagnostics::recorder() {
  return core_->recorder;
}

std::string GroupDiagnostics::dumpLocal(const std::string& reason, size_t maxEntries) {
  return core_->dumpLocal(reason, maxEntries);
}

std::string GroupDiagnostics::recordJson(const std::string& reason) {
  return toJson(core_->snapshot(reason));
}

std::string GroupDiagnostics::dump(const std::string& reason) {
  return core_->dump(reason);
}

int peerNamedIn(const std::string& message) {
  // The comm layer's words (algorithms/op.cc, the arena, the p2p batch): the first match wins.
  for (const char* marker : {"waiting to receive from rank ", "waiting to send to rank ",
                             "waiting for rank(s) ", "waiting for rank "}) {
    const size_t at = message.find(marker);
    if (at == std::string::npos) continue;
    size_t i = at + std::strlen(marker);
    int peer = 0;
    bool any = false;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9' && peer < 1'000'000) {
      peer = peer * 10 + (message[i++] - '0');
      any = true;
    }
    if (any) return peer;
  }
  return -1;
}

void publishFailureRecord(Store& store, int rank, int size, const std::string& ring) {
  store.set(failureRingKey(rank), ring);
  // The first failing rank asks the others: those not failing (idle, elsewhere, stuck in
  // another operation) tell what they are doing.
  const std::string me = std::to_string(rank);
  if (toString(store.compareSet(kRequestedKey, {}, toBytes(me))) != me) return;
  for (int r = 0; r < size; ++r) {
    if (r != rank) requestDump(store, r, "failure");
  }
}

std::string Heartbeat::text() const {
  return detail::str("loom-heartbeat 2 ", timeUs, " ", pid, " ", beat, " ", lastSeq, " ", recorded,
                     " ", intervalMs, " ", host, " ", pidNs.empty() ? "-" : pidNs, " ",
                     clockOffsetUs, " ", clockErrorUs);
}

std::optional<Heartbeat> Heartbeat::parse(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  int version = 0;
  Heartbeat hb;
  if (!(in >> magic >> version >> hb.timeUs >> hb.pid >> hb.beat >> hb.lastSeq >> hb.recorded >>
        hb.intervalMs >> hb.host >> hb.pidNs) ||
      magic != "loom-heartbeat" || (version != 1 && version != 2)) {
    return std::nullopt;
  }
  // Version 2 adds the clock estimate (version 1: none, 0).
  if (version == 2 && !(in >> hb.clockOffsetUs >> hb.clockErrorUs)) return std::nullopt;
  if (hb.pidNs == "-") hb.pidNs.clear();
  return hb;
}

namespace {

// 'R', 'S', 'T', 'Z', ... from /proc/<pid>/stat; 0 when it cannot be read.
char processState(int64_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // "pid (comm) S ...": the comm may hold spaces and parentheses; the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  return close != nullptr && close[1] == ' ' ? close[2] : 0;
}

std::string secondsText(int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(std::max<int64_t>(us, 0)) / 1e6);
  return buf;
}

}  // namespace

std::string livenessOf(const Heartbeat& hb, int64_t nowUs) {
  // Both on rank 0's clock.
  const int64_t age = nowUs - (hb.timeUs - hb.clockOffsetUs);
  const std::string last = "last heartbeat #" + std::to_string(hb.beat) + " " + secondsText(age) +
                           " ago, at collective #" + std::to_string(hb.lastSeq);
  const std::string proc = "process " + std::to_string(hb.pid) + " on " + hb.host;
  // A heartbeat older than three intervals has stopped advancing; with heartbeats off
  // (interval 0, one beat at construction) the age says nothing.
  const bool beating = hb.intervalMs > 0;
  const bool stale = beating && age > 3 * hb.intervalMs * 1000;
  if (hb.host == net::hostname() && !hb.pidNs.empty() && hb.pidNs == pidNamespace()) {
    if (::kill(static_cast<pid_t>(hb.pid), 0) != 0 && errno == ESRCH) {
      return "dead: its " + proc + " no longer exists (" + last + ")";
    }
    const char state = processState(hb.pid);
    if (state == 'Z' || state == 'X') {
      return "dead: its " + proc + " exited (not yet reaped; " + last + ")";
    }
    if (state == 'T' || state == 't') {
      return "alive but not progressing: its " + proc +
             " is stopped (SIGSTOP, or a debugger holds it); " + last;
    }
    if (stale) {
      return "alive but not progressing: its " + proc +
             " exists but its heartbeat stopped advancing (hung, or starved of CPU); " + last;
    }
    if (!beating) {
      return "alive (its " + proc +
             " runs), but it sent no flight record (heartbeats are off: "
             "whether it progresses is unknown)";
    }
    return "alive, its heartbeat advancing (" + last +
           "), but it sent no flight record (its "
           "store listener is blocked)";
  }
  if (!beating) {
    return "unknown: its " + proc + " cannot be looked at from here and heartbeats are off";
  }
  if (stale) {
    return "not progressing: no heartbeat for " + secondsText(age) + " (dead or stopped: its " +
           proc + " cannot be looked at from here; " + last + ")";
  }
  return "alive, its heartbeat advancing (" + last + "), but it sent no flight record";
}

std::vector<std::string> absentNotes(Store& store,
                                     const std::vector<std::optional<RankDump>>& dumps,
                                     std::optional<int64_t> nowUs) {
  std::vector<std::string> notes(dumps.size());
  for (size_t r = 0; r < dumps.size(); ++r) {
    if (dumps[r]) continue;
    const std::string key = heartbeatKey(static_cast<int>(r));
    try {
      if (!store.check({key})) {
        notes[r] = "no heartbeat either (heartbeats off, or it never joined)";
        continue;
      }
      const std::optional<Heartbeat> hb = Heartbeat::parse(store.getString(key));
      notes[r] = hb ? livenessOf(*hb, nowUs.value_or(unixMicros())) : "its heartbeat is unreadable";
    } catch (const std::exception&) {
      return notes;  // the store failed: the caller reports that
    }
  }
  return notes;
}

StragglerTable exchangeStragglers(Store& store, int rank, int size, const std::string& record,
                                  uint64_t round, milliseconds timeout, int waiter) {
  const auto key = [](uint64_t n, int r) {
    return "flight/stragglers/" + std::to_string(n) + "/" + std::to_string(r);
  };
  store.set(key(round, rank), record);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(round, r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    LOOM_THROW(TimeoutError, "rank ", rank, ": stragglers() round ", round, ": ranks [", missing,
               "] did not publish their records within ", timeout.count(),
               " ms (every rank must call stragglers())");
  }
  const std::vector<Bytes> values = store.multiGet(keys);
  // Every rank published round `round`, so every rank finished reading round - 1.
  if (round > 1) {
    store.deleteKey(key(round - 1, rank));
    store.deleteKey(key(round - 1, rank) + "/read");
  }
  store.set(key(round, rank) + "/read", "1");
  if (rank == waiter) {
    std::vector<std::string> read;
    for (int r = 0; r < size; ++r) read.push_back(key(round, r) + "/read");
    try {
      store.wait(read, timeout);
    } catch (const TimeoutError& e) {
      LOOM_LOG_WARNING("rank ", rank, ": stragglers() round ", round,
                       ": not every rank read the records in time (", e.what(),
                       "); the table is complete, the store may go away under them");
    }
  }
  std::vector<std::optional<RankDump>> dumps(size);
  for (int r = 0; r < size; ++r) {
    dumps[r] = parseDump(toString(values[r]), "rank " + std::to_string(r) + "'s record");
  }
  return stragglers(dumps);
}

std::vector<std::optional<RankDump>> collectLive(Store& store, int size, milliseconds wait) {
  // Each rank's last dump is removed first, so that what is read back is this request's.
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    keys.push_back(ringKey(r));
    store.deleteKey(keys.back());
    requestDump(store, r, "doctor");
  }
  try {
    store.wait(keys, wait);
  } catch (const TimeoutError&) {
  }
  std::vector<std::optional<RankDump>> dumps(size);
  for (int r = 0; r < size; ++r) {
    if (store.check({keys[r]})) {
      dumps[r] = parseDump(store.getString(keys[r]), "rank " + std::to_string(r) + "'s record");
    }
  }
  return dumps;
}

std::optional<std::string> storedLiveness(Store& store, int rank, int64_t nowUs) {
  const std::string key = heartbeatKey(rank);
  try {
    if (!store.check({key})) return std::nullopt;
    const std::optional<Heartbeat> hb = Heartbeat::parse(store.getString(key));
    if (!hb) return std::nullopt;
    return livenessOf(*hb, nowUs);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

bool knownDead(Store& store, int rank) {
  const std::optional<std::string> liveness = storedLiveness(store, rank, unixMicros());
  return liveness && liveness->rfind("dead:", 0) == 0;
}

void waitForRanks(Store& store, const std::vector<std::string>& keyOf, Clock::time_point deadline) {
  constexpr milliseconds kLivenessPoll{100};
  for (;;) {
    std::vector<std::string> missing;
    bool allDead = true;
    for (size_t r = 0; r < keyOf.size(); ++r) {
      if (keyOf[r].empty() || store.check({keyOf[r]})) continue;
      missing.push_back(keyOf[r]);
      if (allDead && !knownDead(store, static_cast<int>(r))) allDead = false;
    }
    if (missing.empty() || allDead) return;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return;
    try {
      store.wait(missing, std::min(left, kLivenessPoll));
      return;
    } catch (const TimeoutError&) {  // NOLINT(bugprone-empty-catch): look at liveness again
    }
  }
}

std::string explainFailure(Store& store, int rank, int size, Clock::time_point deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(failureRingKey(r));
  const auto began = Clock::now();
  waitForRanks(store, keys, deadline);
  std::vector<std::optional<RankDump>> dumps(size);
  std::string problems;
  for (int r = 0; r < size; ++r) {
    if (!store.check({keys[r]})) continue;
    try {
      dumps[r] = parseDump(store.getString(keys[r]), "rank " + std::to_string(r) + "'s record");
    } catch (const InvalidArgumentError& e) {
      problems += std::string("; ") + e.what();
    }
  }
  // Now on rank 0's clock, from this rank's own record: its time (its clock) less its offset,
  // plus the time since (its record was published just before this call).
  std::optional<int64_t> now;
  if (rank >= 0 && rank < size && dumps[rank]) {
    now = dumps[rank]->timeUs - dumps[rank]->clockOffsetUs +
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - began).count();
  }
  const std::string mine = explain(dumps, absentNotes(store, dumps, now)) + problems;
  // One explanation for the group: the first rank to get here sets it.
  return toString(store.compareSet(kAnalysisKey, {}, toBytes(mine)));
}

}  // namespace loom::diag
