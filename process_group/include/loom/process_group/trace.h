// Timeline: Chrome / Perfetto trace events of this process (LOOM_TRACE=DIR,
// ProcessGroupOptions::traceDir; docs/diagnostics.md). The first process group created with a
// trace directory opens the trace as its rank; every group's collectives then appear as complete
// events ("X") with their sequence number and bytes on a lane per group, and any code can add
// its own spans: DDP's bucket all-reduces, backward, the optimizer step, a training step.
// `loom-trace merge` joins the ranks' files into one that ui.perfetto.dev opens.
//
// Contract
// - Process-wide, thread-safe. With no trace open, enabled() is one relaxed load and Span /
//   complete() do nothing else: hooks may stay in hot code.
// - Events are appended to <dir>/loom-trace-rank<r>.json (Chrome's JSON Array Format, one
//   event per line) from a buffer written out when full, every second, by flush(), when the
//   group that opened the trace is destroyed, and on a fatal signal (SIGSEGV, SIGBUS, SIGFPE,
//   SIGILL, SIGABRT: abort(); the previous handler is then restored and the signal raised
//   again). The file is readable at every moment: a process killed (SIGKILL) leaves what was
//   written before, an array without its end, which `loom-trace merge` reads. At most
//   kMaxEvents events are kept; later ones are counted as dropped.
// - Times are microseconds since the Unix epoch (system clock), so ranks on one host line up
//   exactly and ranks on several hosts as well as their clocks agree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::trace {

inline constexpr size_t kMaxEvents = size_t{1} << 22;

// True while a trace is open in this process.
bool enabled();
// The trace clock: microseconds since the Unix epoch.
int64_t nowUs();
// A complete event on the calling thread's lane. `argsJson`: a JSON object's members without
// braces ("\"bucket\": 3, \"bytes\": 1048576") or empty.
void complete(std::string_view name, std::string_view category, int64_t startUs, int64_t endUs,
              std::string_view argsJson = {});
// A lane (Chrome "tid") of its own, named `name`, for events that overlap others of the thread
// that emits them (a process group's collectives, DDP's bucket all-reduces: X events on one
// lane must nest). Each call makes a new lane. The name belongs to the trace open at the call;
// a trace opened later shows that lane by number only.
int lane(const std::string& name);
// A complete event on `lane` (from lane()).
void completeOn(int lane, std::string_view name, std::string_view category, int64_t startUs,
                int64_t endUs, std::string_view argsJson = {});
// Writes the pending events to the file now (no-op without a trace). Returns its path, or ""
// when none is open.
std::string flush();

// A span from construction to destruction on the calling thread's lane:
//   { loom::trace::Span s("backward", "ddp"); ... }
class Span {
 public:
  Span(std::string_view name, std::string_view category, std::string argsJson = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  std::string category_;
  std::string args_;
  int64_t startUs_ = 0;  // 0: no trace was open at construction
};

}  // namespace loom::trace
