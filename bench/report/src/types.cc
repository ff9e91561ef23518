#include "loom/bench/types.h"

#include <algorithm>
#include <cctype>

#include "loom/common/error.h"

namespace loom::bench {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

template <typename T, typename NameFn>
std::string joinNames(const std::vector<T>& values, NameFn name) {
  std::string out;
  for (const T& v : values) {
    if (!out.empty()) out += ", ";
    out += name(v);
  }
  return out;
}

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kReduce:
      return "reduce";
    case Op::kGather:
      return "gather";
    case Op::kScatter:
      return "scatter";
    case Op::kAllToAll:
      return "alltoall";
    case Op::kBarrier:
      return "barrier";
    case Op::kSendRecv:
      return "sendrecv";
  }
  return "?";
}

const std::vector<Op>& allOps() {
  static const std::vector<Op> ops = {
      Op::kAllReduce, Op::kBroadcast, Op::kAllGather, Op::kReduceScatter, Op::kReduce,
      Op::kGather,    Op::kScatter,   Op::kAllToAll,  Op::kBarrier,       Op::kSendRecv};
  return ops;
}

Op parseOp(std::string_view name) {
  std::string key = lower(name);
  std::erase(key, '_');
  for (Op op : allOps()) {
    std::string candidate = opName(op);
    std::erase(candidate, '_');
    if (key == candidate) return op;
  }
  LOOM_THROW(InvalidArgumentError, "unknown operation '", name, "': expected one of ",
             joinNames(allOps(), opName));
}

bool opUsesRoot(Op op) {
  return op == Op::kBroadcast || op == Op::kReduce || op == Op::kGather || op == Op::kScatter;
}

bool opUsesRedop(Op op) {
  return op == Op::kAllReduce || op == Op::kReduceScatter || op == Op::kReduce;
}

bool opMovesData(Op op) {
  return op != Op::kBarrier;
}

size_t elemSize(ElemType type) {
  switch (type) {
    case ElemType::kFloat:
      return 4;
    case ElemType::kDouble:
      return 8;
    case ElemType::kHalf:
    case ElemType::kBFloat16:
      return 2;
    case ElemType::kInt8:
    case ElemType::kUInt8:
      return 1;
    case ElemType::kInt32:
      return 4;
    case ElemType::kInt64:
      return 8;
  }
  return 1;
}

const char* elemTypeName(ElemType type) {
  switch (type) {
    case ElemType::kFloat:
      return "float";
    case ElemType::kDouble:
      return "double";
    case ElemType::kHalf:
      return "half";
    case ElemType::kBFloat16:
      return "bfloat16";
    case ElemType::kInt8:
      return "int8";
    case ElemType::kUInt8:
      return "uint8";
    case ElemType::kInt32:
      return "int32";
    case ElemType::kInt64:
      return "int64";
  }
  return "?";
}

const std::vector<ElemType>& allElemTypes() {
  static const std::vector<ElemType> types = {
      ElemType::kFloat, ElemType::kDouble, ElemType::kHalf,  ElemType::kBFloat16,
      ElemType::kInt8,  ElemType::kUInt8,  ElemType::kInt32, ElemType::kInt64};
  return types;
}

ElemType parseElemType(std::string_view name) {
  const std::string key = lower(name);
  for (ElemType type : allElemTypes()) {
    if (key == elemTypeName(type)) return type;
  }
  if (key == "float32" || key == "fp32" || key == "f32") return ElemType::kFloat;
  if (key == "float64" || key == "fp64" || key == "f64") return ElemType::kDouble;
  if (key == "float16" || key == "fp16" || key == "f16") return ElemType::kHalf;
  if (key == "bf16") return ElemType::kBFloat16;
  if (key == "char") return ElemType::kInt8;
  if (key == "int") return ElemType::kInt32;
  if (key == "long") return ElemType::kInt64;
  LOOM_THROW(InvalidArgumentError, "unknown data type '", name, "': expected one of ",
             joinNames(allElemTypes(), elemTypeName), " (or all)");
}

bool isFloatType(ElemType type) {
  return type == ElemType::kFloat || type == ElemType::kDouble || type == ElemType::kHalf ||
         type == ElemType::kBFloat16;
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "sum";
    case RedOp::kProd:
      return "prod";
    case RedOp::kMin:
      return "min";
    case RedOp::kMax:
      return "max";
    case RedOp::kAvg:
      return "avg";
  }
  return "?";
}

const std::vector<RedOp>& allRedOps() {
  static const std::vector<RedOp> ops = {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax,
                                         RedOp::kAvg};
  return ops;
}

RedOp parseRedOp(std::string_view name) {
  const std::string key = lower(name);
  for (RedOp op : allRedOps()) {
    if (key == redOpName(op)) return op;
  }
  LOOM_THROW(InvalidArgumentError, "unknown reduction '", name, "': expected one of ",
             joinNames(allRedOps(), redOpName), " (or all)");
}

Layout layoutFor(Op op, size_t bytes, ElemType type, int worldSize) {
  LOOM_CHECK_GE(worldSize, 1, "world size");
  const size_t n = static_cast<size_t>(worldSize);
  const size_t count = bytes / elemSize(type);
  Layout layout;
  switch (op) {
    case Op::kAllReduce:
    case Op::kBroadcast:
    case Op::kReduce:
    case Op::kSendRecv:
      layout.opCount = layout.sendCount = layout.recvCount = count;
      break;
    case Op::kAllGather:
    case Op::kGather:
      layout.opCount = layout.sendCount = count / n;
      layout.recvCount = layout.opCount * n;
      layout.sendInPlaceOffset = layout.opCount;
      break;
    case Op::kReduceScatter:
    case Op::kScatter:
      layout.opCount = layout.recvCount = count / n;
      layout.sendCount = layout.opCount * n;
      layout.recvInPlaceOffset = layout.opCount;
      break;
    case Op::kAllToAll:
      layout.opCount = count / n;
      layout.sendCount = layout.recvCount = layout.opCount * n;
      break;
    case Op::kBarrier:
      break;
  }
  layout.count = std::max(layout.sendCount, layout.recvCount);
  layout.bytes = layout.count * elemSize(type);
  return layout;
}

double busBwFactor(Op op, int worldSize) {
  const double n = worldSize;
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
    case Op::kGather:
    case Op::kScatter:
      return (n - 1) / n;
    case Op::kBroadcast:
    case Op::kReduce:
    case Op::kSendRecv:
      return 1.0;
    case Op::kBarrier:
      return 0.0;
  }
  return 0.0;
}

Bandwidth bandwidth(Op op, size_t bytes, double seconds, int worldSize) {
  Bandwidth bw;
  if (seconds <= 0) return bw;
  bw.alg = static_cast<double>(bytes) / 1.0e9 / seconds;
  bw.bus = bw.alg * busBwFactor(op, worldSize);
  return bw;
}

}  // namespace loom::bench
