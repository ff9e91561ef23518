#include "algorithms/select.h"

#include <cstdlib>
#include <string>

#include "loom/common/error.h"

namespace loom::comm {

namespace {

// Crossovers (bytes per rank); see the report in bench/kernels/README.md for how they were
// measured on the 2-core loopback development machine.
constexpr size_t kAllreduceSmall = 64 << 10;   // recursive doubling below, ring above
constexpr size_t kBroadcastSmall = 64 << 10;   // tree below, chain above
constexpr size_t kGatherLikeSmall = 16 << 10;  // direct below, ring above

bool supports(OpKind kind, Algorithm a) {
  switch (kind) {
    case OpKind::kAllreduce:
      return a == Algorithm::kRing || a == Algorithm::kRecursiveDoubling || a == Algorithm::kDirect;
    case OpKind::kBroadcast:
      return a == Algorithm::kTree || a == Algorithm::kChain || a == Algorithm::kDirect;
    case OpKind::kReduce:
      return a == Algorithm::kTree || a == Algorithm::kDirect;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      return a == Algorithm::kRing || a == Algorithm::kDirect;
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAlltoall:
      return a == Algorithm::kDirect;
    case OpKind::kBarrier:
      return false;  // one algorithm (dissemination)
    default:
      return false;
  }
}

const char* supportedList(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "auto, ring, rd, direct";
    case OpKind::kBroadcast:
      return "auto, tree, chain, direct";
    case OpKind::kReduce:
      return "auto, tree, direct";
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      return "auto, ring, direct";
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAlltoall:
      return "auto, direct";
    default:
      return "auto";
  }
}

Algorithm automatic(OpKind kind, size_t bytes, int size) {
  switch (kind) {
    case OpKind::kAllreduce:
      return bytes <= kAllreduceSmall ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
    case OpKind::kBroadcast:
      return bytes <= kBroadcastSmall || size <= 2 ? Algorithm::kTree : Algorithm::kChain;
    case OpKind::kReduce:
      return Algorithm::kTree;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      return bytes <= kGatherLikeSmall ? Algorithm::kDirect : Algorithm::kRing;
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAlltoall:
      return Algorithm::kDirect;
    default:
      return Algorithm::kAuto;
  }
}

}  // namespace

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "rd";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kChain:
      return "chain";
  }
  return "unknown";
}

Algorithm parseAlgorithm(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (n == "auto" || n.empty()) return Algorithm::kAuto;
  if (n == "ring") return Algorithm::kRing;
  if (n == "rd" || n == "recursive_doubling" || n == "recursive-doubling") {
    return Algorithm::kRecursiveDoubling;
  }
  if (n == "direct") return Algorithm::kDirect;
  if (n == "tree" || n == "binomial") return Algorithm::kTree;
  if (n == "chain" || n == "pipeline") return Algorithm::kChain;
  LOOM_THROW(InvalidArgumentError, "unknown algorithm '", name,
             "'; expected one of auto, ring, rd, direct, tree, chain");
}

Algorithm selectAlgorithm(OpKind kind, Algorithm requested, size_t bytes, int size) {
  if (requested != Algorithm::kAuto) {
    LOOM_CHECK(supports(kind, requested), "algorithm ", algorithmName(requested),
               " is not implemented for ", opKindName(kind), "; choose one of ",
               supportedList(kind));
    return requested;
  }
  const char* env = std::getenv("LOOM_ALGO");
  if (env != nullptr && *env != '\0') {
    const Algorithm forced = parseAlgorithm(env);
    if (forced != Algorithm::kAuto && supports(kind, forced)) return forced;
  }
  return automatic(kind, bytes, size);
}

}  // namespace loom::comm
