// The trace: events in a vector under a mutex (only while a trace is open), written as one
// Chrome trace-event JSON object {"traceEvents": [...]} with "M" metadata naming the process
// ("rank 3") and its lanes.
#include "diagnostics/tracer.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom::trace {

namespace {

struct Event {
  std::string name;
  std::string category;
  std::string args;
  int64_t startUs;
  int64_t durUs;
  int lane;
};

struct Trace {
  std::mutex mu;
  bool open = false;
  std::string path;
  int rank = 0;
  std::vector<Event> events;
  uint64_t dropped = 0;
  std::vector<std::pair<int, std::string>> lanes;  // named lanes
  int nextLane = 1'000'000;                        // above any thread id
};

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

// The whole file (mu held).
std::string render(const Trace& t) {
  std::string out = "{\"traceEvents\": [\n";
  out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(t.rank) +
         ", \"tid\": 0, \"args\": {\"name\": \"rank " + std::to_string(t.rank) + "\"}}";
  out += ",\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(t.rank) +
         ", \"tid\": 0, \"args\": {\"sort_index\": " + std::to_string(t.rank) + "}}";
  for (const auto& [lane, name] : t.lanes) {
    out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(t.rank) +
           ", \"tid\": " + std::to_string(lane) + ", \"args\": {\"name\": \"";
    appendEscaped(out, name);
    out += "\"}}";
  }
  for (const Event& e : t.events) {
    out += ",\n{\"name\": \"";
    appendEscaped(out, e.name);
    out += "\", \"cat\": \"";
    appendEscaped(out, e.category);
    out += "\", \"ph\": \"X\", \"ts\": " + std::to_string(e.startUs) +
           ", \"dur\": " + std::to_string(e.durUs) + ", \"pid\": " + std::to_string(t.rank) +
           ", \"tid\": " + std::to_string(e.lane);
    if (!e.args.empty()) out += ", \"args\": {" + e.args + "}";
    out += "}";
  }
  out += "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"loom\", \"dropped\": " +
         std::to_string(t.dropped) + "}}\n";
  return out;
}

// Writes the file (mu held); a failed write is a warning.
std::string writeLocked(const Trace& t) {
  const std::string text = render(t);
  const std::string tmp = t.path + ".tmp" + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(tmp.c_str(), t.path.c_str()) == 0;
  if (!ok) {
    LOOM_LOG_WARNING("rank ", t.rank, ": could not write the trace to ", t.path, ": ",
                     std::strerror(errno));
    std::remove(tmp.c_str());
    return "";
  }
  return t.path;
}

void add(Trace& t, std::string_view name, std::string_view category, int64_t startUs, int64_t endUs,
         std::string_view args, int lane) {
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.open) return;
  if (t.events.size() >= kMaxEvents) {
    ++t.dropped;
    return;
  }
  t.events.push_back(Event{std::string(name), std::string(category), std::string(args), startUs,
                           std::max<int64_t>(endUs - startUs, 0), lane});
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
  return t.open ? writeLocked(t) : "";
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
  if (t.open) return false;
  t.open = true;
  t.rank = rank;
  t.path = dir + "/loom-trace-rank" + std::to_string(rank) + ".json";
  t.events.clear();
  t.lanes.clear();
  t.dropped = 0;
  gEnabled.store(true, std::memory_order_relaxed);
  return true;
}

void close() {
  Trace& t = state();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.open) return;
  const std::string path = writeLocked(t);
  if (!path.empty()) LOOM_LOG_INFO("rank ", t.rank, ": trace written to ", path);
  gEnabled.store(false, std::memory_order_relaxed);
  t.open = false;
  t.events.clear();
  t.events.shrink_to_fit();
}

int lane(const std::string& name) {
  Trace& t = state();
  std::lock_guard<std::mutex> lock(t.mu);
  const int id = t.nextLane++;
  t.lanes.emplace_back(id, name);
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
