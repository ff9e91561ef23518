// The nccl backend's pure pieces (nccl_backend.h, nccl_api.h): the (dtype, op) -> NCCL mapping,
// the device choice, the claim of a rank and the versioned unique-id exchange. No CUDA, no NCCL.
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/store/rank_claim.h"
#include "loom/store/setup_failure.h"
#include "loom/store/store.h"
#include "nccl/nccl_api.h"
#include "nccl/nccl_backend.h"

namespace loom::nccl_detail {

const char* ncclTypeName(NcclType type) {
  switch (type) {
    case NcclType::kInt8:
      return "ncclInt8";
    case NcclType::kUint8:
      return "ncclUint8";
    case NcclType::kInt32:
      return "ncclInt32";
    case NcclType::kUint32:
      return "ncclUint32";
    case NcclType::kInt64:
      return "ncclInt64";
    case NcclType::kUint64:
      return "ncclUint64";
    case NcclType::kFloat16:
      return "ncclFloat16";
    case NcclType::kFloat32:
      return "ncclFloat32";
    case NcclType::kFloat64:
      return "ncclFloat64";
    case NcclType::kBfloat16:
      return "ncclBfloat16";
  }
  return "ncclType?";
}

const char* ncclOpName(NcclOp op) {
  switch (op) {
    case NcclOp::kSum:
      return "ncclSum";
    case NcclOp::kProd:
      return "ncclProd";
    case NcclOp::kMax:
      return "ncclMax";
    case NcclOp::kMin:
      return "ncclMin";
    case NcclOp::kAvg:
      return "ncclAvg";
  }
  return "ncclOp?";
}

NcclType ncclTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return NcclType::kFloat32;
    case DType::kFloat64:
      return NcclType::kFloat64;
    case DType::kFloat16:
      return NcclType::kFloat16;
    case DType::kBFloat16:
      return NcclType::kBfloat16;
    case DType::kInt8:
      return NcclType::kInt8;
    case DType::kUInt8:
      return NcclType::kUint8;
    case DType::kInt32:
      return NcclType::kInt32;
    case DType::kInt64:
      return NcclType::kInt64;
    case DType::kBool:
      return NcclType::kUint8;
  }
  throwUnknownDType(dtype);
}

NcclReduction ncclReductionOf(const std::string& who, const char* opName, DType dtype,
                              ReduceOp op) {
  const NcclType type = ncclTypeOf(dtype);
  if (dtype == DType::kBool) {
    // Logical OR / AND on 0/1 bytes, as c10d: the largest or the smallest byte.
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return {type, NcclOp::kMax};
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return {type, NcclOp::kMin};
      case ReduceOp::kAvg:
        LOOM_THROW(InvalidArgumentError, who, ": ", opName,
                   ": reduce op avg is not defined for dtype bool (as in c10d); use sum (logical "
                   "or) or convert to a floating dtype");
      case ReduceOp::kBxor:
        LOOM_THROW(InvalidArgumentError, who, ": ", opName,
                   ": NCCL has no bitwise reductions, so bxor on bool (a parity, unlike or and "
                   "and, which run as max and min) cannot run on the nccl backend; use the tcp "
                   "backend");
    }
  }
  switch (op) {
    case ReduceOp::kSum:
      return {type, NcclOp::kSum};
    case ReduceOp::kProd:
      return {type, NcclOp::kProd};
    case ReduceOp::kMin:
      return {type, NcclOp::kMin};
    case ReduceOp::kMax:
      return {type, NcclOp::kMax};
    case ReduceOp::kAvg:
      return {type, NcclOp::kAvg};
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      break;
  }
  LOOM_THROW(InvalidArgumentError, who, ": ", opName, ": NCCL has no bitwise reductions (",
             reduceOpName(op), " on ", dtypeName(dtype), "); use the tcp backend for ",
             reduceOpName(op), " (on bool, band and bor run here as min and max)");
}

std::string uniqueIdKey(const std::string& group, int64_t incarnation) {
  return "nccl/" + (group.empty() ? std::string("default") : group) + "/" +
         std::to_string(incarnation) + "/unique_id";
}

int64_t nextIncarnation(Store& store, const std::string& group, int rank) {
  return store.add("nccl/" + (group.empty() ? std::string("default") : group) + "/incarnation/" +
                       std::to_string(rank),
                   1);
}

std::string claimKey(const std::string& group, int rank) {
  return "nccl/" + (group.empty() ? std::string("default") : group) + "/claim/" +
         std::to_string(rank);
}

void claimGroupRank(Store& store, const std::string& group, int rank, int size,
                    std::chrono::milliseconds timeout) {
  if (size == 1) return;
  const std::string base = "nccl/" + (group.empty() ? std::string("default") : group) + "/";
  const std::string failedKey = base + "setup-failed";
  try {
    claimRank(store, claimKey(group, rank), rank, size);
  } catch (const InvalidArgumentError& e) {
    publishSetupFailure(store, failedKey, e);
    throw;
  }
  std::vector<std::string> claims;
  for (int r = 0; r < size; ++r) claims.push_back(claimKey(group, r));
  // Every rank claimed (a group created again by the same processes finds its claims there):
  // no failure of this group's setup concerns this instance.
  if (store.check(claims)) return;
  const Deadline deadline(timeout);
  try {
    waitWatchingSetup(store, claims, deadline, failedKey,
                      "rank " + std::to_string(rank) + ": nccl group setup stopped");
  } catch (const TimeoutError& e) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({claims[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (missing.empty()) return;  // the last one arrived as the deadline passed
    LOOM_THROW(TimeoutError, "rank ", rank, ": nccl group setup timed out after ",
               deadline.elapsed().count(), " ms: rank(s) ", missing, " never joined (no key ", base,
               "claim/<rank>); every rank of the group must create it (", e.what(), ")");
  }
}

std::string exchangeUniqueId(Store& store, const std::string& group, int rank,
                             const std::string& id, size_t idBytes,
                             std::chrono::milliseconds timeout) {
  const int64_t incarnation = nextIncarnation(store, group, rank);
  const std::string key = uniqueIdKey(group, incarnation);
  if (rank == 0) {
    store.set(key, id);
    return id;
  }
  try {
    store.wait({key}, timeout);
  } catch (const TimeoutError& e) {
    LOOM_THROW(TimeoutError, "rank ", rank, ": no NCCL unique id under ", key, " within ",
               timeout.count(), " ms: rank 0 has not created incarnation ", incarnation,
               " of this group (every rank creates the group the same number of times on one "
               "store; ",
               e.what(), ")");
  }
  const std::string got = store.getString(key);
  if (got.size() != idBytes) {
    LOOM_THROW(IoError, "rank ", rank, ": store key ", key, " holds ", got.size(),
               " bytes; expected an ncclUniqueId of ", idBytes, " bytes");
  }
  return got;
}

int pickDevice(int requested, int localRank, int rank, int deviceCount) {
  LOOM_CHECK_T(NotAvailableError, deviceCount > 0, "nccl backend: no CUDA device is visible");
  if (requested >= 0) {
    if (requested >= deviceCount) {
      LOOM_THROW(InvalidArgumentError, "nccl backend: device ", requested, " requested but only ",
                 deviceCount, " CUDA device(s) are visible");
    }
    return requested;
  }
  return (localRank >= 0 ? localRank : rank) % deviceCount;
}

}  // namespace loom::nccl_detail
