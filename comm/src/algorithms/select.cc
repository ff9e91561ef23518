#include "algorithms/select.h"

#include <span>
#include <string>
#include <string_view>

#include "loom/common/error.h"

namespace loom::comm {

namespace {

// Crossovers (bytes per rank), measured with bench/kernels/loom_comm_timing on the 2-core
// development VM, process ranks on loopback (figures in bench/kernels/README.md). The VM was
// heavily loaded by parallel builds while measuring, so these are coarse: all-reduce
// recursive doubling beat the ring up to 64 KiB and tied at 256 KiB with 2 ranks, and still
// won at 256 KiB with 4 ranks (ring 2.9x faster at 1 MiB); broadcast chain beat the tree from
// 64 KiB on 4 ranks; direct all-gather was no slower than the ring up to 64 KiB per rank.
constexpr size_t kAllreduceSmall2 = 128 << 10;  // 2 ranks: recursive doubling up to here
constexpr size_t kAllreduceSmall = 256 << 10;   // more ranks
// Halving-doubling above kAllreduceSmall up to here when the world size is a power of two from
// 4 (measured at 4 ranks on 2 cores, LOOM_SHM=0, medians of 3 interleaved runs, 22 Nov 2026:
// hd 1.78 / 2.36 / 1.19 / 1.16 / 1.02 GB/s at 512 KiB / 1 / 4 / 16 / 64 MiB against the ring's
// 1.47 / 1.26 / 1.05 / 1.05 / 1.10; with 3 ranks the fold of the extra rank makes it lose to the
// ring: 1.18 vs 2.56 GB/s at 1 MiB).
constexpr size_t kAllreduceHalvingDoublingMax = 32 << 20;
constexpr size_t kBroadcastSmall = 64 << 10;   // tree below, chain above
constexpr size_t kGatherLikeSmall = 64 << 10;  // direct below, ring above

// The algorithms that can be forced for each operation (besides auto), in the order error
// messages list them.
std::span<const Algorithm> forcible(OpType kind) {
  using A = Algorithm;
  static constexpr A kAllreduce[] = {A::kRing, A::kRecursiveDoubling, A::kHalvingDoubling,
                                     A::kDirect};
  static constexpr A kBroadcast[] = {A::kTree, A::kChain, A::kDirect};
  static constexpr A kReduce[] = {A::kTree, A::kDirect};
  static constexpr A kRingOrDirect[] = {A::kRing, A::kDirect};
  static constexpr A kDirectOnly[] = {A::kDirect};
  switch (kind) {
    case OpType::kAllreduce:
      return kAllreduce;
    case OpType::kBroadcast:
      return kBroadcast;
    case OpType::kReduce:
      return kReduce;
    case OpType::kAllgather:
    case OpType::kReduceScatter:
      return kRingOrDirect;
    case OpType::kGather:
    case OpType::kScatter:
    case OpType::kAlltoall:
    case OpType::kAlltoallv:
    case OpType::kAllgatherv:
    case OpType::kGatherv:
    case OpType::kReduceScatterv:
      return kDirectOnly;
    default:
      return {};  // barrier (dissemination) and the rest: one algorithm
  }
}

bool supports(OpType kind, Algorithm a) {
  for (Algorithm f : forcible(kind)) {
    if (f == a) return true;
  }
  return false;
}

// "auto, ring, rd, hd, direct"
std::string supportedList(OpType kind) {
  std::string list = "auto";
  for (Algorithm f : forcible(kind)) list += std::string(", ") + algorithmName(f);
  return list;
}

const SizeRules* rulesOf(OpType kind, const Crossovers& x) {
  switch (kind) {
    case OpType::kAllreduce:
      return &x.allreduceRules;
    case OpType::kBroadcast:
      return &x.broadcastRules;
    case OpType::kAllgather:
      return &x.allgatherRules;
    case OpType::kReduceScatter:
      return &x.reduceScatterRules;
    default:
      return nullptr;
  }
}

}  // namespace

Algorithm ruleFor(const SizeRules& rules, size_t bytes) {
  Algorithm chosen = Algorithm::kAuto;
  for (const SizeRule& r : rules) {
    if (r.from > bytes) break;
    chosen = r.algorithm;
  }
  return chosen;
}

bool implementsAlgorithm(OpType kind, Algorithm algorithm) {
  return algorithm != Algorithm::kAuto && supports(kind, algorithm);
}

Algorithm automaticAlgorithm(OpType kind, size_t bytes, int size, const Crossovers& x) {
  if (const SizeRules* rules = rulesOf(kind, x); rules != nullptr) {
    const Algorithm a = ruleFor(*rules, bytes);
    if (a != Algorithm::kAuto) return a;
  }
  switch (kind) {
    case OpType::kAllreduce:
      if (bytes <= x.allreduceRdMax) return Algorithm::kRecursiveDoubling;
      if (size >= 4 && (size & (size - 1)) == 0 && bytes <= x.allreduceHdMax) {
        return Algorithm::kHalvingDoubling;
      }
      return Algorithm::kRing;
    case OpType::kBroadcast:
      return bytes <= x.broadcastTreeMax || size <= 2 ? Algorithm::kTree : Algorithm::kChain;
    case OpType::kReduce:
      return Algorithm::kTree;
    case OpType::kAllgather:
    case OpType::kReduceScatter:
      return bytes <= x.gatherDirectMax ? Algorithm::kDirect : Algorithm::kRing;
    case OpType::kGather:
    case OpType::kScatter:
    case OpType::kAlltoall:
    case OpType::kAlltoallv:
    case OpType::kAllgatherv:
    case OpType::kGatherv:
    case OpType::kReduceScatterv:
      return Algorithm::kDirect;
    default:
      return Algorithm::kAuto;
  }
}

Crossovers builtinCrossovers(int worldSize) {
  Crossovers x;
  x.allreduceRdMax = worldSize <= 2 ? kAllreduceSmall2 : kAllreduceSmall;
  x.allreduceHdMax = kAllreduceHalvingDoublingMax;
  x.broadcastTreeMax = kBroadcastSmall;
  x.gatherDirectMax = kGatherLikeSmall;
  return x;
}

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
    case Algorithm::kHalvingDoubling:
      return "hd";
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
  if (n == "hd" || n == "halving_doubling" || n == "halving-doubling" || n == "rabenseifner") {
    return Algorithm::kHalvingDoubling;
  }
  if (n == "direct") return Algorithm::kDirect;
  if (n == "tree" || n == "binomial") return Algorithm::kTree;
  if (n == "chain" || n == "pipeline") return Algorithm::kChain;
  LOOM_THROW(InvalidArgumentError, "unknown algorithm '", name,
             "'; expected one of auto, ring, rd, hd, direct, tree, chain");
}

void checkAlgorithm(OpType kind, Algorithm requested) {
  if (requested == Algorithm::kAuto) return;
  if (kind == OpType::kBarrier) {
    LOOM_THROW(InvalidArgumentError, "barrier has one algorithm (dissemination); got ",
               algorithmName(requested));
  }
  LOOM_CHECK(supports(kind, requested), "algorithm ", algorithmName(requested),
             " is not implemented for ", opTypeName(kind), "; choose one of ", supportedList(kind));
}

Algorithm selectAlgorithm(OpType kind, Algorithm requested, Algorithm forced, size_t bytes,
                          int size, const Crossovers* crossovers) {
  if (requested != Algorithm::kAuto) return requested;
  if (forced != Algorithm::kAuto && supports(kind, forced)) return forced;
  return automaticAlgorithm(kind, bytes, size,
                            crossovers != nullptr ? *crossovers : builtinCrossovers(size));
}

}  // namespace loom::comm
