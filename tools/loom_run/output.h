// loom-run's own output: the workers' prefixed lines and loom-run's reports, written to its
// stdout and stderr by one writer thread.
//
// Why a thread: whatever reads loom-run's stdout can stall (a paused pager, a pipe nobody
// drains). A blocking write() in the supervision loop would stall that loop with it: no worker
// failure noticed, no signal forwarded, no heartbeat to the other nodes, which would then take
// this node for dead. With the writer thread only the writer waits.
//
// Contract
// - write() never blocks: it queues the text for fd 1 or 2. Texts reach each fd whole and in
//   the order they were queued.
// - pending(fd) is what is queued for fd and not yet written. The supervision loop stops reading
//   a worker's pipe while its fd holds kHighWater or more, so a stalled reader stalls the
//   workers that write (as it would without loom-run) and nothing is dropped. wakeFd() becomes
//   readable when a backed-up fd has drained to half of kHighWater; poll it to read on.
// - A write that fails (EPIPE: the reader is gone) drops what is queued for that fd from then on,
//   as the kernel would have: loom-run and its workers go on.
// - flush() waits until everything queued is written, or until `stop` returns true (asked about
//   every 100 ms). loom-run calls it before it exits; a signal to loom-run stops the wait.
// - Thread-safe. The writer thread starts with the first write() and is never joined, so block
//   the launcher's signals (SignalWatcher) before the first write: the thread inherits the mask.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace loom::run::output {

constexpr size_t kHighWater = size_t{4} << 20;

void write(int fd, std::string text);
size_t pending(int fd);
int wakeFd();
// Reads wakeFd() empty (non-blocking).
void clearWake();
// true when everything queued was written (or dropped after a failed write).
bool flush(const std::function<bool()>& stop);

}  // namespace loom::run::output
