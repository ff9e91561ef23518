#include "process_group_loom.h"

#include <utility>

#include "loom/common/error.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/process_group/factory.h"
#include "store_adapter.h"

namespace loom::torch_backend {

namespace {

ProcessGroupOptions loomOptions(const BackendOptions& options) {
  ProcessGroupOptions pg;
  pg.timeout = options.timeout;
  // As initProcessGroup does: peers on other hosts reach us on the address on the route to
  // the store's host (the host name may resolve to 127.0.1.1 on Debian).
  if (!options.storeHost.empty() && !settings::text("LOOM_HOST")) {
    pg.comm.context.host = net::localAddressTowards(options.storeHost);
  }
  return pg;
}

}  // namespace

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   const BackendOptions& options)
    : c10d::ProcessGroup(rank, size) {
  LOOM_CHECK(options.timeout.count() > 0, "loom backend: timeout must be positive, got ",
             options.timeout.count(), " ms");
  store_ = std::make_shared<TorchStore>(store);
  store_->setTimeout(options.timeout);
  pg_ = createProcessGroup("tcp", store_, rank, size, loomOptions(options));
}

ProcessGroupLoom::~ProcessGroupLoom() = default;

uint64_t ProcessGroupLoom::storeRequests() const {
  return store_->requests();
}

ReduceOp toLoomReduceOp(const c10d::ReduceOp& op, const char* opName) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      return ReduceOp::kBand;
    case c10d::ReduceOp::BOR:
      return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::kBxor;
    default:
      LOOM_THROW(InvalidArgumentError, opName, ": the loom backend does not support reduce op ",
                 static_cast<int>(op.op_), " (PREMUL_SUM is NCCL's)");
  }
}

OptionalTimeout toLoomTimeout(std::chrono::milliseconds timeout) {
  if (timeout == c10d::kUnsetTimeout || timeout.count() <= 0) return std::nullopt;
  return timeout;
}

}  // namespace loom::torch_backend
