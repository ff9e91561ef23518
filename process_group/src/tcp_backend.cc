#include "loom/process_group/tcp_backend.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"

namespace loom {

namespace {

// True when `text` mentions `name` as a whole token ("allreduce#1" is not in
// "allreduce#17").
bool mentions(const std::string& text, const std::string& name) {
  for (size_t pos = text.find(name); pos != std::string::npos; pos = text.find(name, pos + 1)) {
    const size_t end = pos + name.size();
    if (end >= text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string failureKey(int rank) {
  return "failure/" + std::to_string(rank);
}

std::string signatureKey(uint64_t seq, int rank) {
  return "sig/" + std::to_string(seq) + "/" + std::to_string(rank);
}

}  // namespace

ProcessGroupTcp::ProcessGroupTcp(std::shared_ptr<Store> store, int rank, int size,
                                 const ProcessGroupOptions& options)
    : ProcessGroup("tcp", std::move(store), rank, size, options) {
  comm::ContextOptions ctxOptions;
  ctxOptions.timeout = options.timeout;
  ctxOptions.host = options.host;
  ctxOptions.sharedMemory = options.sharedMemory;
  ctxOptions.socketsPerPeer = options.socketsPerPeer;
  ctx_ = comm::Context::create(*this->store(), rank, size, ctxOptions);
  if (debugLevel() != DebugLevel::kOff) {
    LOOM_LOG_INFO(who(), ": tcp process group of size ", size, " ready");
  }
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupTcp::~ProcessGroupTcp() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroupTcp::checkDevice(const BufferView& buf, const char* opName) const {
  if (buf.device.type != DeviceType::kCpu) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName,
               ": the tcp backend takes CPU buffers, got a ", deviceName(buf.device),
               " buffer (use the nccl backend for CUDA memory)");
  }
}

bool ProcessGroupTcp::isBroken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

bool ProcessGroupTcp::markBroken(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return false;
  broken_ = true;
  brokenCause_ = cause;
  return true;
}

void ProcessGroupTcp::abort(const std::string& reason) {
  std::shared_ptr<comm::Context> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      brokenCause_ = who() + ": aborted: " + reason;
    }
    ctx = ctx_;
  }
  wake_.notify_all();
  if (ctx) ctx->abort(reason);
}

std::shared_ptr<Work> ProcessGroupTcp::post(OpDesc op) {
  auto work = std::make_shared<Work>(opTypeName(op.type), op.seq, rank());
  std::weak_ptr<ProcessGroup> self = weak_from_this();
  work->setOnWaitTimeout([self](const std::string& reason) {
    if (auto pg = self.lock()) pg->abort(reason);
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      queue_.push_back(Item{std::move(op), work});
      wake_.notify_all();
      return work;
    }
  }
  // A broken group fails at once, without touching the queue.
  const std::string cause = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return brokenCause_;
  }();
  work->markFailed(std::make_exception_ptr(
      IoError(who() + ": " + op.describe() + " was not run: the group failed earlier: " + cause)));
  return work;
}

void ProcessGroupTcp::workerLoop() {
  for (;;) {
    Item item;
    bool broken = false;
    bool closeNow = false;
    std::string cause;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // ctx_ is still set while broken only after abort() with no failed operation.
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || (broken_ && ctx_); });
      broken = broken_;
      cause = brokenCause_;
      if (broken_ && ctx_) {
        closeNow = true;
      } else if (!queue_.empty()) {
        item = std::move(queue_.front());
        queue_.pop_front();
      } else {
        break;  // stopping, and the queue is drained
      }
    }
    if (closeNow) {
      try {
        store()->set(failureKey(rank()), "io\n" + cause);
      } catch (const std::exception& e) {
        LOOM_LOG_WARNING(who(), ": could not publish the failure report: ", e.what());
      }
      std::shared_ptr<comm::Context> closing;
      {
        std::lock_guard<std::mutex> lock(mu_);
        closing = std::move(ctx_);
      }
      continue;  // `closing` goes out of scope outside the lock: connections close
    }

    if (broken) {
      item.work->markFailed(std::make_exception_ptr(IoError(
          who() + ": " + item.op.describe() + " was not run: the group failed earlier: " + cause)));
      continue;
    }
    if (isCollective(item.op.type) && debugLevel() == DebugLevel::kDetail) {
      try {
        checkSignature(item.op);
      } catch (const InvalidArgumentError&) {
        // A signature mismatch is seen alike by every rank: the op is skipped everywhere and
        // the group stays consistent.
        item.work->markFailed(std::current_exception());
        continue;
      } catch (...) {
        item.work->markFailed(handleFailure(item.op, std::current_exception()));
        continue;
      }
    }
    try {
      run(item.op);
      item.work->markCompleted();
    } catch (...) {
      item.work->markFailed(handleFailure(item.op, std::current_exception()));
    }
  }
}

void ProcessGroupTcp::run(const OpDesc& op) {
  comm::Context& ctx = *ctx_;
  comm::CollectiveOptions copts;
  copts.timeout = op.timeout;
  copts.seq = op.seq;
  copts.algorithm = options().algorithm;
  switch (op.type) {
    case OpType::kAllreduce:
      comm::allreduce(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, copts);
      break;
    case OpType::kBroadcast:
      comm::broadcast(ctx, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kReduce:
      comm::reduce(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, op.root, copts);
      break;
    case OpType::kAllgather:
      comm::allgather(ctx, op.in.data, op.out.data, op.count, op.dtype, copts);
      break;
    case OpType::kReduceScatter:
      comm::reduceScatter(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, copts);
      break;
    case OpType::kGather:
      comm::gather(ctx, op.in.data, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kScatter:
      comm::scatter(ctx, op.in.data, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kAlltoall:
      comm::alltoall(ctx, op.in.data, op.out.data, op.count, op.dtype, copts);
      break;
    case OpType::kBarrier:
      comm::barrier(ctx, copts);
      break;
    case OpType::kSend:
      comm::send(ctx, op.in.data, op.count, op.dtype, op.root, op.tag, copts);
      break;
    case OpType::kRecv:
      comm::recv(ctx, op.out.data, op.count, op.dtype, op.root, op.tag, copts);
      break;
  }
}

void ProcessGroupTcp::checkSignature(const OpDesc& op) {
  Store& store = *this->store();
  const std::string mine = op.signature();
  store.set(signatureKey(op.seq, rank()), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(signatureKey(op.seq, r));
  try {
    store.wait(keys, op.timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(who() + ": " + op.describe() +
                       " (LOOM_DEBUG=DETAIL signature check): ranks [" + joinRanks(missing) +
                       "] did not reach collective #" + std::to_string(op.seq) + " within " +
                       std::to_string(op.timeout.count()) + " ms");
  }
  const std::vector<Bytes> values = store.multiGet(keys);
  // Every rank has written signature seq, so it has finished reading seq - 1: ours can go.
  if (lastSignatureSeq_ != 0) store.deleteKey(signatureKey(lastSignatureSeq_, rank()));
  lastSignatureSeq_ = op.seq;

  std::map<std::string, std::vector<int>> byValue;
  for (int r = 0; r < size(); ++r) byValue[toString(values[r])].push_back(r);
  if (byValue.size() == 1) return;
  std::string detail;
  for (const auto& [signature, ranks] : byValue) {
    detail += "\n  " + signature + " on ranks [" + joinRanks(ranks) + "]";
  }
  throw InvalidArgumentError(who() + ": collective #" + std::to_string(op.seq) +
                             " does not match across ranks (LOOM_DEBUG=DETAIL); this rank called " +
                             mine + ":" + detail);
}

std::exception_ptr ProcessGroupTcp::handleFailure(const OpDesc& op, std::exception_ptr error) {
  std::string what = "unknown exception";
  bool timedOut = false;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    what = e.what();
    timedOut = true;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::string own = what;
  if (!mentions(what, op.describe().substr(0, op.describe().find(' ')))) {
    own = who() + ": " + op.describe() + ": " + what;
  } else if (what.find("rank " + std::to_string(rank())) == std::string::npos) {
    own = who() + ": " + what;
  }
  markBroken(own);
  wake_.notify_all();

  // Publish, then close our connections so the peers blocked on us fail now.
  Store& store = *this->store();
  try {
    store.set(failureKey(rank()), std::string(timedOut ? "timeout" : "io") + "\n" + own);
  } catch (const std::exception& e) {
    LOOM_LOG_WARNING(who(), ": could not publish the failure report: ", e.what());
  }
  {
    std::shared_ptr<comm::Context> closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = std::move(ctx_);
    }
  }

  // Collect the other ranks' reports for a bounded window.
  const auto window = std::min(options().failureReportWindow, op.timeout / 2);
  std::vector<std::string> keys;
  std::vector<int> peers;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    keys.push_back(failureKey(r));
    peers.push_back(r);
  }
  std::string reports;
  std::vector<int> silent;
  bool anyTimeout = timedOut;
  try {
    if (!keys.empty()) {
      try {
        store.wait(keys, window);
      } catch (const TimeoutError&) {
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!store.check({keys[i]})) {
        silent.push_back(peers[i]);
        continue;
      }
      const std::string report = store.getString(keys[i]);
      const size_t nl = report.find('\n');
      const std::string kind = report.substr(0, nl);
      if (kind == "timeout") anyTimeout = true;
      reports += "\n  rank " + std::to_string(peers[i]) +
                 " reported: " + (nl == std::string::npos ? report : report.substr(nl + 1));
    }
  } catch (const std::exception& e) {
    reports +=
        "\n  (the failure reports could not be read from the store: " + std::string(e.what()) + ")";
  }

  std::string message = own;
  if (!silent.empty()) {
    message += "\n  ranks that sent no failure report within " + std::to_string(window.count()) +
               " ms (dead, stopped, or not at this operation): " + joinRanks(silent);
  }
  message += reports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    brokenCause_ = message;
  }
  if (anyTimeout) return std::make_exception_ptr(TimeoutError(message));
  return std::make_exception_ptr(IoError(message));
}

}  // namespace loom
