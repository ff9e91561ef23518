#include "request_core.h"

#include "loom/common/error.h"

namespace loom::comm {

bool RequestCore::fail(const std::string& error, Failure kind) {
  uint32_t expected = kPending;
  if (!state_.compare_exchange_strong(expected, kFailing, std::memory_order_seq_cst)) return false;
  error_ = error;
  failure_ = kind;
  state_.store(kFailed, std::memory_order_seq_cst);
  onFinished();
  return true;
}

void RequestCore::throwError() const {
  if (failure_ == Failure::kInvalidArgument) throw InvalidArgumentError(error_);
  throw IoError(error_);
}

}  // namespace loom::comm
