#include "loom/process_group/factory.h"

#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "loom/process_group/tcp_backend.h"

#ifdef LOOM_HAVE_NCCL
#include "nccl/nccl_backend.h"
#endif

namespace loom {

std::vector<std::string> backendNames() {
  return {"tcp", "nccl", "verbs"};
}

// checkAvailable is the one place that decides; isAvailable only asks it.
bool isAvailable(const std::string& backend) {
  try {
    checkAvailable(backend);
    return true;
  } catch (const NotAvailableError&) {
    return false;
  } catch (const InvalidArgumentError&) {
    return false;
  }
}

void checkAvailable(const std::string& backend) {
  if (backend == "tcp") return;
  if (backend == "nccl") {
#ifdef LOOM_HAVE_NCCL
    if (ncclDeviceCount() == 0) {
      LOOM_THROW(NotAvailableError, "nccl backend: no CUDA device is visible");
    }
    return;
#else
    LOOM_THROW(NotAvailableError, "built without NCCL (LOOM_WITH_NCCL=OFF)");
#endif
  }
  if (backend == "verbs") {
    std::string why;
    if (!comm::verbsAvailable(&why)) {
      LOOM_THROW(NotAvailableError, "createProcessGroup(\"verbs\"): ", why);
    }
    return;
  }
  LOOM_THROW(InvalidArgumentError, "unknown backend \"", backend,
             "\"; expected one of: tcp, nccl, verbs");
}

std::shared_ptr<ProcessGroup> createProcessGroup(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 const ProcessGroupOptions& options) {
  LOOM_CHECK(store != nullptr, "createProcessGroup(\"", backend, "\"): the store is null");
  LOOM_CHECK(size >= 1, "createProcessGroup(\"", backend,
             "\"): world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "createProcessGroup(\"", backend, "\"): rank ", rank,
             " is out of range for world size ", size, " (expected 0 <= rank < ", size, ")");
  checkAvailable(backend);
  if (backend == "tcp") {
    return std::make_shared<ProcessGroupTcp>(std::move(store), rank, size, options);
  }
#ifdef LOOM_HAVE_NCCL
  if (backend == "nccl") return createProcessGroupNccl(std::move(store), rank, size, options);
#endif
  return std::make_shared<ProcessGroupTcp>("verbs", std::move(store), rank, size, options,
                                           &comm::createVerbsContext);
}

}  // namespace loom
