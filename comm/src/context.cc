// The Context implementation: a transport to every peer plus scratch memory for the
// algorithms. Today the transport is always tcp with one socket per peer: the
// ContextOptions fields sharedMemory and socketsPerPeer are accepted but not used yet (the
// shm and verbs transports, and striping over several sockets, will be picked here).
#include "loom/comm/context.h"

#include <array>
#include <cstdlib>
#include <memory>

#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "tcp/tcp_transport.h"

namespace loom::comm {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class ContextImpl : public Context {
 public:
  ContextImpl(int rank, int size, std::unique_ptr<Transport> transport)
      : rank_(rank), size_(size), transport_(std::move(transport)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void abort(const std::string& reason) override {
    transport_->abort(detail::str("rank ", rank_, ": context aborted: ", reason));
  }
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
  std::array<Buffer, kSlots> scratch_;
};

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
  return std::make_shared<ContextImpl>(rank, size, std::move(transport));
}

}  // namespace loom::comm
