#include "tag.h"

#include "loom/common/error.h"

namespace loom::comm {

std::string describeTag(uint64_t tag) {
  if (isPointToPointTag(tag)) return detail::str("send/recv tag ", tag & kMaxP2PTag);
  return detail::str(opTypeName(tagKind(tag)), "#", tagSeq(tag), " step ", tagStep(tag));
}

}  // namespace loom::comm
