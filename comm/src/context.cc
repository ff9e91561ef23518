// The Context implementation: a transport to every peer plus scratch memory for the
// algorithms. The transport is tcp with one socket per peer (socketsPerPeer is accepted but
// not used yet); when every rank is on this host and sharedMemory is on, the Context also
// holds a shared-memory arena that the collectives use instead (shm/arena.h).
#include "loom/comm/context.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/store/store.h"
#include "shm/shm.h"
#include "tcp/tcp_transport.h"

namespace loom::comm {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class ContextImpl : public Context {
 public:
  ContextImpl(int rank, int size, std::unique_ptr<Transport> transport,
              std::unique_ptr<shm::Arena> arena)
      : rank_(rank), size_(size), transport_(std::move(transport)), arena_(std::move(arena)) {
    if (arena_) arena_->setTransport(transport_.get());
  }
  // The arena goes first: it is unmapped before the sockets close.
  ~ContextImpl() override { arena_.reset(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void abort(const std::string& reason) override {
    const std::string message = detail::str("rank ", rank_, ": context aborted: ", reason);
    if (arena_) arena_->abort(rank_, message);
    transport_->abort(message);
  }
  shm::Arena* arena() { return arena_.get(); }
  Transport& transport() override { return *transport_; }

  void* scratch(size_t bytes, int slot) override {
    LOOM_CHECK(slot >= 0 && slot < kSlots, "scratch slot ", slot, " out of range");
    Buffer& b = scratch_[slot];
    if (b.bytes < bytes || !b.data) {
      const size_t rounded = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr) LOOM_THROW(IoError, "cannot allocate ", rounded, " bytes of scratch");
      b.data.reset(p);
      b.bytes = rounded;
    }
    return b.data.get();
  }

 private:
  static constexpr int kSlots = 4;
  struct Buffer {
    std::unique_ptr<void, FreeDeleter> data;
    size_t bytes = 0;
  };
  const int rank_;
  const int size_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<shm::Arena> arena_;
  std::array<Buffer, kSlots> scratch_;
};

// Same-host ranks get a shared-memory arena. Every rank publishes its host identity (or
// "off" when shared memory is disabled on it) so that all ranks take the same decision.
std::unique_ptr<shm::Arena> createArena(Store& store, int rank, int size,
                                        const ContextOptions& options) {
  if (size < 2) return nullptr;
  const bool enabled = options.sharedMemory && shm::sharedMemoryEnabledByEnv();
  const std::string prefix = options.storePrefix + "/shm";
  store.set(detail::str(prefix, "/host/", rank), enabled ? shm::hostIdentity() : "off");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::str(prefix, "/host/", r));
  store.wait(keys, options.timeout);
  const std::vector<Bytes> hosts = store.multiGet(keys);
  for (const Bytes& h : hosts) {
    if (h != hosts[0] || toString(h) == "off") return nullptr;
  }
  shm::ArenaOptions aopts;
  aopts.timeout = options.timeout;
  aopts.keyPrefix = prefix;
  return shm::Arena::create(store, rank, size, aopts);
}

}  // namespace

std::shared_ptr<Context> Context::create(Store& store, int rank, int size,
                                         const ContextOptions& options) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  LOOM_CHECK(options.socketsPerPeer >= 1, "socketsPerPeer must be at least 1");
  tcp::TcpOptions topts;
  topts.timeout = options.timeout;
  topts.host = options.host;
  topts.keyPrefix = options.storePrefix + "/tcp";
  topts.bufferBytes = options.socketBufferBytes;
  auto transport = tcp::TcpTransport::create(store, rank, size, topts);
  return std::make_shared<ContextImpl>(rank, size, std::move(transport),
                                       createArena(store, rank, size, options));
}

namespace shm {

Arena* arenaOf(Context& ctx) {
  auto* impl = dynamic_cast<ContextImpl*>(&ctx);
  return impl != nullptr ? impl->arena() : nullptr;
}

Arena* arenaFor(Context& ctx, const CollectiveOptions& opts) {
  if (opts.algorithm != Algorithm::kAuto) return nullptr;
  const char* env = std::getenv("LOOM_ALGO");
  if (env != nullptr && *env != '\0' && std::strcmp(env, "auto") != 0 &&
      std::strcmp(env, "shm") != 0) {
    return nullptr;
  }
  return arenaOf(ctx);
}

}  // namespace shm

}  // namespace loom::comm
