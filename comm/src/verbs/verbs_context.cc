// createVerbsContext / verbsAvailable (loom/comm/verbs.h) and the Context over the verbs
// transport.
#include "verbs/verbs_context.h"

#include <array>
#include <cstdlib>

#include "context_settings.h"
#include "engine/engine.h"
#include "engine/engines.h"
#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "verbs/ibv_ops.h"
#include "verbs/verbs_transport.h"

namespace loom::comm {

namespace verbs {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class VerbsContext : public Context {
 public:
  VerbsContext(int rank, int size, std::unique_ptr<Transport> transport,
               const GenericEngineOptions& generic, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), transport_(std::move(transport)) {
    setTimeout(timeout);
    setEngines(std::make_unique<EngineSet>(makeGenericEngine(generic), nullptr, generic.algorithm));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void abort(const std::string& reason) override {
    transport_->abort(detail::str("rank ", rank_, ": context aborted: ", reason));
  }
  std::string transportSummary() const override { return "verbs"; }
  Transport& transport() override { return *transport_; }

  void* scratch(size_t bytes, int slot) override {
    LOOM_CHECK(slot >= 0 && slot < kSlots, "scratch slot ", slot, " out of range");
    Buffer& b = scratch_[slot];
    if (b.bytes < bytes || !b.data) {
      const size_t rounded = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr) LOOM_THROW(IoError, "cannot allocate ", rounded, " bytes of scratch");
      if (b.data) transport_->unregisterBuffer(b.registered);
      b.data.reset(p);
      b.bytes = rounded;
      // Scratch is sent from over and over: register it so those sends go zero-copy.
      b.registered = transport_->registerBuffer(p, rounded);
    }
    return b.data.get();
  }

  ~VerbsContext() override {
    releaseEngines();
    for (auto& b : scratch_) {
      if (b.data) transport_->unregisterBuffer(b.registered);
    }
  }

 private:
  static constexpr int kSlots = 4;
  struct Buffer {
    std::unique_ptr<void, FreeDeleter> data;
    size_t bytes = 0;
    RegisteredBuffer registered;
  };
  const int rank_;
  const int size_;
  std::unique_ptr<Transport> transport_;
  std::array<Buffer, kSlots> scratch_;
};

}  // namespace

std::shared_ptr<Context> createContextWithOps(Store& store, int rank, int size,
                                              const ContextOptions& options,
                                              std::unique_ptr<VerbsOps> ops,
                                              const VerbsConfig& config) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  VerbsTransportOptions topts;
  topts.timeout = options.timeout;
  topts.keyPrefix = options.storePrefix + "/verbs";
  topts.slots = config.slots;
  topts.slotBytes = config.slotBytes;
  auto transport = VerbsTransport::create(store, rank, size, std::move(ops), topts);
  GenericEngineOptions generic;
  generic.algorithm = options.algorithm;
  generic.chunkBytes = options.chunkBytes;
  return std::make_shared<VerbsContext>(rank, size, std::move(transport), generic, options.timeout);
}

}  // namespace verbs

bool verbsAvailable(std::string* why, const VerbsOptions& options) {
  try {
    ContextOptions all;
    all.verbs = options;
    all = withEnvironment(all);
    validateOptions(all);
    const verbs::VerbsConfig config = verbs::verbsConfigFrom(all.verbs);
    verbs::selectDevice(verbs::listDevices(), config.device);
    return true;
  } catch (const std::exception& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
}

std::shared_ptr<Context> createVerbsContext(Store& store, int rank, int size,
                                            const ContextOptions& callerOptions) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  const ContextOptions options = withEnvironment(callerOptions);
  validateOptions(options);
  setReduceIsa(options.reduceIsa);
  const verbs::VerbsConfig config = verbs::verbsConfigFrom(options.verbs);
  auto ops = verbs::openIbvOps(config, size);
  return verbs::createContextWithOps(store, rank, size, options, std::move(ops), config);
}

}  // namespace loom::comm
