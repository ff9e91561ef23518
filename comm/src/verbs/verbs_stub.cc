// createVerbsContext / verbsAvailable when Loom is built without libibverbs.
#include "loom/comm/verbs.h"
#include "loom/common/error.h"

namespace loom::comm {

bool verbsAvailable(std::string* why, const VerbsOptions&) {
  if (why != nullptr) *why = "built without verbs (LOOM_WITH_VERBS=OFF or libibverbs not found)";
  return false;
}

std::shared_ptr<Context> createVerbsContext(Store&, int, int, const ContextOptions&) {
  LOOM_THROW(NotAvailableError,
             "built without verbs (LOOM_WITH_VERBS=OFF or libibverbs not found; install "
             "libibverbs-dev and reconfigure)");
}

}  // namespace loom::comm
