// Context: one rank's connected membership in a communicator: its rank, the world size, and
// a transport to each peer an algorithm needs, set up through a Store.
//
// Contract
// - Context::create is collective: every rank calls it with the same store (or a store with
//   the same prefix) and its own rank; it returns once this rank is connected, or throws
//   TimeoutError naming the ranks that never published their address.
// - A Context is used by one thread at a time (the ProcessGroup's worker thread); abort()
//   may be called from any thread and makes blocked and future operations fail fast with
//   IoError.
// - A Context owns its collective engines, chosen once at creation (the shared-memory arena,
//   the hierarchical engine or the generic algorithms over its transport); collectives.h
//   dispatches every call to one of them.
// - The destructor closes every connection and never throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace loom {
class Store;
}

namespace loom::comm {

struct ContextOptions {
  // Connection setup and default collective deadline.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Address this rank listens on for peers; empty = LOOM_HOST when set, else the hostname's
  // address (127.0.0.1 with a warning when that cannot be listened on). An address given here
  // or in LOOM_HOST that cannot be listened on is an IoError.
  std::string host;
  // Same-host peers use shared memory when available (LOOM_SHM=0 turns it off).
  bool sharedMemory = true;
  // Parallel TCP connections per peer for bandwidth (only 1 is implemented so far).
  int socketsPerPeer = 1;
  // Store keys are "<storePrefix>/..."; every Context on one Store needs its own prefix
  // (or a PrefixStore), and the keys of an old Context must not be reused.
  std::string storePrefix = "comm";
  // SO_SNDBUF/SO_RCVBUF per socket; 0 takes the tcp transport's default (LOOM_TCP_BUFFER_BYTES
  // if set, else the kernel's autotuning); a negative value forces autotuning, which on Linux
  // grows the receive buffer up to net.ipv4.tcp_rmem's maximum (32 MiB on the dev VM), more
  // than an explicit size may (capped by net.core.rmem_max, 4 MiB there).
  int socketBufferBytes = 0;
  // How long (µs) a thread waiting on a TCP transfer keeps polling the sockets without
  // blocking after bytes last moved, yielding the core between passes: < 0 the default
  // (LOOM_TCP_BUSY_US if set, else 1000); 0 blocks in poll() at once (less CPU, more latency
  // and lower bandwidth where wake-ups are slow, as on VMs).
  int busyPollUs = -1;
};

class Transport;
class EngineSet;  // comm-internal (comm/src/engine/engine.h)

class Context {
 public:
  static std::shared_ptr<Context> create(Store& store, int rank, int size,
                                         const ContextOptions& options = {});
  virtual ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Fail every blocked and future operation with IoError(reason); thread-safe.
  virtual void abort(const std::string& reason) = 0;
  // What carries this rank's data, for logs and benchmark headers: "tcp", "shm (all 4 ranks
  // on this host)", "shm within hosts (2 ranks on this host), tcp between 2 hosts", "verbs".
  // Fixed at creation; thread-safe.
  virtual std::string transportSummary() const = 0;

  // The transport the algorithms run over (collectives.h); owned by the Context.
  virtual Transport& transport() = 0;
  // Scratch memory for algorithms, at least `bytes` long, 64-byte aligned, kept between
  // calls; `slot` picks one of a few independent buffers. Valid until the next call with the
  // same slot. Only for the thread running collectives.
  virtual void* scratch(size_t bytes, int slot = 0) = 0;

  // The collective engines, for comm's own dispatch (collectives.cc); null for a Context
  // implemented outside comm, whose collectives then run the generic algorithms with default
  // settings. A plain member, not a virtual, so that dispatch costs no extra call.
  EngineSet* engines() const { return engines_.get(); }

 protected:
  Context();
  // Called once by the implementation's constructor, after its transport exists.
  void setEngines(std::unique_ptr<EngineSet> engines);
  // Destroys the engines now: an implementation whose engines use its transport calls this
  // first in its destructor (shared memory is unmapped before the sockets close).
  void releaseEngines() noexcept;

 private:
  std::unique_ptr<EngineSet> engines_;
};

}  // namespace loom::comm
