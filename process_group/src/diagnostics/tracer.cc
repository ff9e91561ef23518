// The trace: a Chrome trace-event file in the JSON Array Format, one event per line, appended as
// the process runs, so that what is on disk is readable at every moment:
//
//   [
//   {"name": "process_name", "ph": "M", ...},        metadata: the process ("rank 3"), lanes
//   {"name": "allreduce#5", "ph": "X", ...},         one line per event, each ending in ","
//   ...
//   {"name": "trace_end", "ph": "M", ..., "args": {"dropped": 0}}
//   ]
//
// The last two lines come when the trace is closed; a process that dies first leaves the file
// without them, which the Chrome format allows and `loom-trace merge` reads (an unterminated
// array; a last line cut short is dropped).
//
// How it works: each event is formatted into a line on the calling thread and copied, under
// the mutex, into `pending`, a buffer allocated once and never freed; pending bytes reach the
// file (opened O_APPEND) when the buffer is full, once a second (the flusher thread), on
// flush() and at close. A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: abort() and
// std::terminate too) runs onFatalSignal, which write(2)s the pending bytes (async-signal-safe:
// no lock, no allocation, only complete lines: `pendingLen` is stored after the copy), puts the
// signal's previous disposition back and raises it again. So does SIGTERM, the signal a
// launcher stops the other ranks with after a failure, when the program left it at its default.
// SIGKILL leaves what was written before it: at most the last second's events are lost.
//
// One trace per process: every group with a trace directory takes a reference (open) and gives
// it back (close); the file is closed with the last, so a group destroyed first (the broken
// group after a shrink) does not end the trace of the groups that go on. A restarted worker
// (LOOM_RESTART_COUNT, or torchrun's TORCHELASTIC_RESTART_COUNT, above 0) writes
// loom-trace-rank<r>-restart<k>.json, so the attempt that failed keeps its trace.
#include "diagnostics/tracer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"

namespace loom::trace {

namespace {

// Bytes of formatted events held before they are written.
constexpr size_t kPendingBytes = size_t{1} << 20;
// How often the flusher writes what is pending.
constexpr std::chrono::milliseconds kFlushInterval{1000};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
// Flushed on as well when the program has not taken it (its default disposition ends the
// process without unwinding).
constexpr int kStopSignals[] = {SIGTERM};
constexpr int kMaxSignal = 64;

struct Trace {
  std::mutex mu;  // guards everything below but the atomics
  bool open = false;
  int users = 0;  // the groups that opened it and have not closed it
  std::string path;
  int rank = 0;
  size_t events = 0;
  uint64_t dropped = 0;
  int nextLane = 1'000'000;  // above any thread id
  // The flusher's stop and wake-up (mu).
  bool stopping = false;
  std::condition_variable wake;
  std::thread flusher;
};

// Read by the signal handler: never freed, published before the handler is installed.
char* gPending = nullptr;
std::atomic<size_t> gPendingLen{0};
std::atomic<int> gFd{-1};
std::atomic<bool> gWriting{false};  // a flush is writing `gPending` (the handler leaves it)
std::atomic<bool> gCrashWritten{false};
struct sigaction gPrevious[kMaxSignal + 1];
bool gHandlersInstalled = false;       // mu
bool gInstalled[kMaxSignal + 1] = {};  // the signals whose handler is ours (mu)

std::atomic<bool> gEnabled{false};

Trace& state() {
  static Trace* t = new Trace;  // never destroyed: spans may end after main returns
  return *t;
}

void appendEscaped(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

int threadLane() {
  thread_local const int tid = static_cast<int>(::syscall(SYS_gettid));
  return tid;
}

// Writes all of [data, data + n) to `fd`; false on an error.
bool writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes the pending bytes to the file (mu held); a failed write is a warning, once.
void flushLocked(Trace& t) {
  const size_t n = gPendingLen.load(std::memory_order_acquire);
  const int fd = gFd.load(std::memory_order_relaxed);
  if (n == 0 || fd < 0) return;
  gWriting.store(true, std::memory_order_release);
  const bool ok = writeAll(fd, gPending, n);
  gPendingLen.store(0, std::memory_order_release);
  gWriting.store(false, std::memory_order_release);
  if (!ok) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      LOOM_LOG_WARNING("rank ", t.rank, ": could not write the trace to ", t.path, ": ",
                       std::strerror(errno));
    }
  }
}

// Appends one formatted line (mu held).
void appendLocked(Trace& t, std::string_view line) {
  if (gPendingLen.load(std::memory_order_relaxed) + line.size() > kPendingBytes) flushLocked(t);
  if (line.size() > kPendingBytes) {
    const int fd = gFd.load(std::memory_order_relaxed);
    if (fd >= 0) writeAll(fd, line.data(), line.size());
    return;
  }
  const size_t at = gPendingLen.load(std::memory_order_relaxed);
  std::memcpy(gPending + at, line.data(), line.size());
  gPendingLen.store(at + line.size(), std::memory_order_release);
}

std::string metadataLine(int rank, int lane, std::string_view name, std::string_view argsJson) {
  return "{\"name\": \"" + std::string(name) +
         "\", \"ph\": \"M\", \"pid\": " + std::to_string(rank) +
         ", \"tid\": " + std::to_string(lane) + ", \"args\": {" + std::string(argsJson) + "}},\n";
}

void add(Trace& t, std::string_view name, std::string_view category, int64_t startUs, int64_t endUs,
         std::string_view args, int lane) {
  thread_local std::string line;
  line.clear();
  line += "{\"name\": \"";
  appendEscaped(line, name);
  line += "\", \"cat\": \"";
  appendEscaped(line, category);
  line += "\", \"ph\": \"X\", \"ts\": ";
  line += std::to_string(startUs);
  line += ", \"dur\": ";
  line += std::to_string(std::max<int64_t>(endUs - startUs, 0));
  line += ", \"pid\": ";
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.open) return;
  if (t.events >= kMaxEvents) {
    ++t.dropped;
    return;
  }
  ++t.events;
  line += std::to_string(t.rank);
  line += ", \"tid\": ";
  line += std::to_string(lane);
  if (!args.empty()) {
    line += ", \"args\": {";
    line += args;
    line += "}";
  }
  line += "},\n";
  appendLocked(t, line);
}

void onFatalSignal(int sig) {
  const int saved = errno;
  const int fd = gFd.load(std::memory_order_acquire);
  if (fd >= 0 && !gCrashWritten.exchange(true) && !gWriting.load(std::memory_order_acquire)) {
    const size_t n = gPendingLen.load(std::memory_order_acquire);
    if (n > 0) writeAll(fd, gPending, n);
  }
  // The previous disposition (the default: terminate, dump core), raised again on return.
  ::sigaction(sig, &gPrevious[sig], nullptr);
  errno = saved;
  ::raise(sig);
}

void installHandlers() {
  if (gHandlersInstalled) return;
  struct sigaction action {};
  action.sa_handler = onFatalSignal;
  sigemptyset(&action.sa_mask);
  for (const int sig : kFatalSignals) {
    gInstalled[sig] = ::sigaction(sig, &action, &gPrevious[sig]) == 0;
  }
  for (const int sig : kStopSignals) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      gInstalled[sig] = ::sigaction(sig, &action, &gPrevious[sig]) == 0;
    }
  }
  gHandlersInstalled = true;
}

void removeHandlers() {
  if (!gHandlersInstalled) return;
  for (int sig = 1; sig <= kMaxSignal; ++sig) {
    if (!gInstalled[sig]) continue;
    gInstalled[sig] = false;
    struct sigaction current {};
    // A handler installed after ours stays; it chains to ours, which now only re-raises.
    if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == onFatalSignal) {
      ::sigaction(sig, &gPrevious[sig], nullptr);
    }
  }
  gHandlersInstalled = false;
}

void flushEverySecond(Trace* t) {
  std::unique_lock<std::mutex> lock(t->mu);
  while (!t->stopping) {
    t->wake.wait_for(lock, kFlushInterval, [&] { return t->stopping; });
    flushLocked(*t);
  }
}

}  // namespace

bool enabled() {
  return gEnabled.load(std::memory_order_relaxed);
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void complete(std::string_view name, std::string_view category, int64_t startUs, int64_t endUs,
              std::string_view argsJson) {
  if (!enabled()) return;
  add(state(), name, category, startUs, endUs, argsJson, threadLane());
}

void completeOn(int lane, std::string_view name, std::string_view category, int64_t startUs,
                int64_t endUs, std::string_view argsJson) {
  if (!enabled()) return;
  add(state(), name, category, startUs, endUs, argsJson, lane);
}

std::string flush() {
  Trace& t = state();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.open) return "";
  flushLocked(t);
  return t.path;
}

bool open(const std::string& dir, int rank) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(dir.c_str(), W_OK) != 0) {
    LOOM_THROW(InvalidArgumentError, "rank ", rank, ": trace directory '", dir,
               "' (LOOM_TRACE, ProcessGroupOptions::traceDir) is not a writable directory",
               errno != 0 ? std::string(": ") + std::strerror(errno) : "");
  }
  Trace& t = state();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.open) {
    ++t.users;
    return true;
  }
  int64_t restart = settings::integer("LOOM_RESTART_COUNT").value_or(0);
  if (restart == 0) restart = settings::integer("TORCHELASTIC_RESTART_COUNT").value_or(0);
  const std::string path = dir + "/loom-trace-rank" + std::to_string(rank) +
                           (restart > 0 ? "-restart" + std::to_string(restart) : "") + ".json";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    LOOM_THROW(InvalidArgumentError, "rank ", rank, ": cannot create the trace file '", path,
               "': ", std::strerror(errno));
  }
  if (gPending == nullptr) gPending = new char[kPendingBytes];
  gPendingLen.store(0, std::memory_order_relaxed);
  gCrashWritten.store(false, std::memory_order_relaxed);
  gFd.store(fd, std::memory_order_release);
  t.open = true;
  t.users = 1;
  t.rank = rank;
  t.path = path;
  t.events = 0;
  t.dropped = 0;
  t.stopping = false;
  appendLocked(t, "[\n");
  appendLocked(
      t, metadataLine(rank, 0, "process_name", "\"name\": \"rank " + std::to_string(rank) + "\""));
  appendLocked(
      t, metadataLine(rank, 0, "process_sort_index", "\"sort_index\": " + std::to_string(rank)));
  flushLocked(t);  // a valid (empty) trace on disk from the start
  installHandlers();
  try {
    t.flusher = std::thread(flushEverySecond, &t);
  } catch (const std::exception& e) {
    LOOM_LOG_WARNING("rank ", rank, ": no thread to flush the trace every second: ", e.what());
  }
  gEnabled.store(true, std::memory_order_relaxed);
  return true;
}

void close() {
  Trace& t = state();
  std::thread flusher;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (!t.open || --t.users > 0) return;
    t.stopping = true;
    flusher = std::move(t.flusher);
  }
  t.wake.notify_all();
  if (flusher.joinable()) flusher.join();
  std::lock_guard<std::mutex> lock(t.mu);
  gEnabled.store(false, std::memory_order_relaxed);
  std::string end =
      metadataLine(t.rank, 0, "trace_end", "\"dropped\": " + std::to_string(t.dropped));
  end.resize(end.size() - 2);  // the last event: no ","
  appendLocked(t, end + "\n]\n");
  flushLocked(t);
  removeHandlers();
  const int fd = gFd.exchange(-1);
  const bool ok = ::close(fd) == 0;
  if (ok) LOOM_LOG_INFO("rank ", t.rank, ": trace written to ", t.path);
  t.open = false;
}

int lane(const std::string& name) {
  Trace& t = state();
  std::lock_guard<std::mutex> lock(t.mu);
  const int id = t.nextLane++;
  if (t.open) {
    std::string args = "\"name\": \"";
    appendEscaped(args, name);
    appendLocked(t, metadataLine(t.rank, id, "thread_name", args + "\""));
  }
  return id;
}

Span::Span(std::string_view name, std::string_view category, std::string argsJson) {
  if (!enabled()) return;
  name_ = name;
  category_ = category;
  args_ = std::move(argsJson);
  startUs_ = nowUs();
}

Span::~Span() {
  if (startUs_ == 0) return;
  complete(name_, category_, startUs_, nowUs(), args_);
}

}  // namespace loom::trace
