#include "loom/process_group/tcp_backend.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/deadline.h"
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

// The failure-report exchange through the store. It runs on its own detached thread, which
// owns copies of everything it touches, so that a store that does not answer (its host is
// stopped, the network is cut) never holds the worker past its window: the worker waits on
// `published` and `done` with deadlines and goes on without the reports when they pass. The
// thread itself ends when the store's own deadline passes.
struct FailureExchange {
  std::mutex mu;
  std::condition_variable changed;
  bool published = false;
  bool done = false;
  std::vector<int> silent;  // ranks with no report within the window
  std::string reports;      // "\n  rank 1 reported: ..." lines
  bool anyTimeout = false;  // some rank's failure was a timeout
  std::string storeError;   // the store failed while reading the reports

  // Publishes `report` under this rank's key, then (when `collect`) waits up to `window` for
  // the other ranks' keys and reads them.
  static void run(std::shared_ptr<FailureExchange> self, std::shared_ptr<Store> store, int rank,
                  int size, std::string report, milliseconds window, bool collect) {
    try {
      store->set(failureKey(rank), report);
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("rank ", rank, ": could not publish the failure report: ", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->published = true;
    }
    self->changed.notify_all();
    if (!collect) return;

    std::vector<int> silent;
    std::string reports;
    bool anyTimeout = false;
    std::string storeError;
    try {
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) {
        if (r != rank) keys.push_back(failureKey(r));
      }
      if (!keys.empty()) {
        try {
          store->wait(keys, window);
        } catch (const TimeoutError&) {
        }
      }
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        if (!store->check({failureKey(r)})) {
          silent.push_back(r);
          continue;
        }
        const std::string got = store->getString(failureKey(r));
        const size_t nl = got.find('\n');
        if (got.substr(0, nl) == "timeout") anyTimeout = true;
        reports += "\n  rank " + std::to_string(r) +
                   " reported: " + (nl == std::string::npos ? got : got.substr(nl + 1));
      }
    } catch (const std::exception& e) {
      storeError = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->silent = std::move(silent);
      self->reports = std::move(reports);
      self->anyTimeout = anyTimeout;
      self->storeError = std::move(storeError);
      self->done = true;
    }
    self->changed.notify_all();
  }

  // Starts run() on a detached thread; returns null when no thread could be started.
  static std::shared_ptr<FailureExchange> start(std::shared_ptr<Store> store, int rank, int size,
                                                std::string report, milliseconds window,
                                                bool collect) {
    auto self = std::make_shared<FailureExchange>();
    try {
      std::thread(run, self, std::move(store), rank, size, std::move(report), window, collect)
          .detach();
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("rank ", rank, ": no thread for the failure report: ", e.what());
      return nullptr;
    }
    return self;
  }

  // Waits until `flag` is set or `until` passes; returns whether it was set.
  bool waitFor(const bool& flag, Clock::time_point until) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_until(lock, until, [&] { return flag; });
  }
};

// How often a waiting send / recv batch looks for more send / recv operations to start:
// every kP2PSliceMin at first, backing off to kP2PSliceMax while nothing changes.
constexpr milliseconds kP2PSliceMin{1};
constexpr milliseconds kP2PSliceMax{10};

// Extra time the store gets beyond the report window before the worker gives up on it: at
// most half the window, so that window + slack <= 0.75 x the timeout and a failure is raised
// within 1.75 x the timeout.
constexpr milliseconds kStoreSlack{500};
milliseconds storeSlack(milliseconds window) {
  return std::min(kStoreSlack, window / 2);
}

// The hand-off (see tcp_backend.h): how long the worker leaves a fresh lone operation to its
// waiter, how long it naps while waiters run operations, and for how long after the last
// inline run it keeps napping. A waiter calls wait() within a microsecond of issuing in the
// usual issue-then-wait code; the grace only has to cover a preempted caller now and then.
constexpr std::chrono::microseconds kGrace{50};
constexpr std::chrono::microseconds kNap{1000};
constexpr milliseconds kHotWindow{5};

std::chrono::microseconds microsFromEnv(const char* name, std::chrono::microseconds fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const long long us = std::strtoll(v, &end, 10);
  if (*end != 0 || us < 0 || us > 1000000) {
    LOOM_THROW(InvalidArgumentError, name, "='", v,
               "' is not a duration; expected microseconds from 0 to 1000000");
  }
  return std::chrono::microseconds(us);
}

}  // namespace

ProcessGroupTcp::ProcessGroupTcp(std::shared_ptr<Store> store, int rank, int size,
                                 const ProcessGroupOptions& options)
    : ProcessGroupTcp("tcp", std::move(store), rank, size, options,
                      [](Store& s, int r, int n, const comm::ContextOptions& o) {
                        return comm::Context::create(s, r, n, o);
                      }) {}

ProcessGroupTcp::ProcessGroupTcp(std::string backend, std::shared_ptr<Store> store, int rank,
                                 int size, const ProcessGroupOptions& options,
                                 const ContextFactory& makeContext)
    : ProcessGroup(std::move(backend), std::move(store), rank, size, options),
      grace_(microsFromEnv("LOOM_PG_GRACE_US", kGrace)),
      nap_(microsFromEnv("LOOM_PG_NAP_US", kNap)) {
  comm::ContextOptions ctxOptions;
  ctxOptions.timeout = options.timeout;
  ctxOptions.host = options.host;
  ctxOptions.sharedMemory = options.sharedMemory;
  ctxOptions.socketsPerPeer = options.socketsPerPeer;
  ctx_ = makeContext(*this->store(), rank, size, ctxOptions);
  if (debugLevel() != DebugLevel::kOff) {
    LOOM_LOG_INFO(who(), ": ", backendName(), " process group of size ", size, " ready");
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
  if (debugLevel() != DebugLevel::kOff) {
    const HandoffStats& st = stats_;
    LOOM_LOG_INFO(who(), ": hand-off: ", st.inlineRuns, " operations run by their waiters, ",
                  st.workerRuns, " by the worker; the worker was woken by ", st.issueWakes,
                  " issues and ", st.waiterWakes, " waiters, waited ", st.workerWaits, " times (",
                  st.graceWaits, " holding a fresh operation for its waiter)");
  }
}

void ProcessGroupTcp::checkDevice(const BufferView& buf, const char* opName) const {
  if (buf.device.type != DeviceType::kCpu) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName, ": the ", backendName(),
               " backend takes CPU buffers, got a ", deviceName(buf.device),
               " buffer (use the nccl backend for CUDA memory)");
  }
}

bool ProcessGroupTcp::isBroken() const {
  return brokenFlag_.load(std::memory_order_acquire);
}

bool ProcessGroupTcp::markBroken(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return false;
  broken_ = true;
  brokenFlag_.store(true, std::memory_order_release);
  brokenCause_ = cause;
  return true;
}

void ProcessGroupTcp::abort(const std::string& reason) {
  std::shared_ptr<comm::Context> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      brokenFlag_.store(true, std::memory_order_release);
      brokenCause_ = who() + ": aborted: " + reason;
    }
    ctx = ctx_;
  }
  wake_.notify_all();
  if (ctx) ctx->abort(reason);
}

namespace {

// A Work that lets its waiter run the operation (see the hand-off in tcp_backend.h): the
// unbounded wait() runs the queue up to this operation inline when nothing runs, and a wait
// that is about to sleep tells the worker to start the queue at once.
class TcpWork final : public Work {
 public:
  TcpWork(const OpDesc& op, int rank, std::weak_ptr<ProcessGroup> group)
      : Work(opTypeName(op.type), op.seq, rank), group_(std::move(group)) {}

 protected:
  bool runInline() override {
    auto group = group_.lock();
    return group && static_cast<ProcessGroupTcp&>(*group).runInline(this);
  }
  void beforeSleep() override {
    if (auto group = group_.lock()) static_cast<ProcessGroupTcp&>(*group).wakeForWaiter(this);
  }
  // wait(timeout) expired: abort the group (a TimeoutError always means it is unusable).
  void onWaitTimeout(const std::string& reason) override {
    if (auto group = group_.lock()) group->abort(reason);
  }

 private:
  std::weak_ptr<ProcessGroup> group_;
};

}  // namespace

std::shared_ptr<Work> ProcessGroupTcp::post(OpDesc op) {
  // The weak pointer is null when this group is not owned by a shared_ptr: then no inline
  // runs (and a bounded wait that expires cannot abort the group).
  auto work = std::make_shared<TcpWork>(op, rank(), weak_from_this());
  bool queued = false;
  bool wake = false;
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) {
      cause = brokenCause_;
    } else {
      queue_.push_back(Item{op, work, queue_.empty() && !running_, TimePoint{}});
      queued = true;
      wake = workerNeedsWakeLocked();
      stats_.issueWakes += wake;
    }
  }
  if (queued) {
    if (wake) wake_.notify_all();
    return work;
  }
  // A broken group fails at once, without touching the queue.
  work->markFailed(std::make_exception_ptr(
      IoError(who() + ": " + op.describe() + " was not run: the group failed earlier: " + cause)));
  return work;
}

bool ProcessGroupTcp::workerNeedsWakeLocked() const {
  if (running_ || workerState_ == WorkerState::kBusy) {
    // The worker looks at the queue before it waits again; the thread running an operation
    // inline wakes it when it is done (runInline).
    return false;
  }
  if (workerState_ == WorkerState::kSleeping || stopping_ || broken_ || urgent_) return true;
  // Napping: it comes back on its own within the nap; a lone fresh operation is left to its
  // waiter. More than one queued means nobody waited: start now.
  return queue_.size() > 1;
}

void ProcessGroupTcp::workerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    workerState_ = WorkerState::kBusy;
    const TimePoint now = Clock::now();
    if (stats_.inlineRuns != inlineSeen_) {
      inlineSeen_ = stats_.inlineRuns;
      inlineSeenAt_ = now;
    }
    const bool hot = nap_.count() > 0 && now - inlineSeenAt_ < kHotWindow;
    if (running_) {
      // A waiter runs an operation inline; it wakes the worker when it is done and work is
      // left. Napping (not sleeping) while waiters run operations keeps the next issue from
      // having to wake the worker.
      ++stats_.workerWaits;
      if (hot) {
        workerState_ = WorkerState::kNapping;
        wake_.wait_for(lock, nap_);
      } else {
        workerState_ = WorkerState::kSleeping;
        wake_.wait(lock);
      }
      continue;
    }
    // ctx_ is still set while broken only after abort() with no failed operation.
    if (broken_ && ctx_) {
      const std::string cause = brokenCause_;
      running_ = true;
      lock.unlock();
      const milliseconds window = std::min(options().failureReportWindow, options().timeout / 2);
      auto exchange =
          FailureExchange::start(store(), rank(), size(), "io\n" + cause, window, false);
      if (exchange) exchange->waitFor(exchange->published, Clock::now() + window);
      std::shared_ptr<comm::Context> closing;
      {
        std::lock_guard<std::mutex> relock(mu_);
        closing = std::move(ctx_);
      }
      closing.reset();  // outside the lock: the connections close
      lock.lock();
      running_ = false;
      continue;
    }
    if (queue_.empty()) {
      urgent_ = false;
      if (stopping_) break;  // the queue is drained
      ++stats_.workerWaits;
      if (hot) {
        workerState_ = WorkerState::kNapping;
        wake_.wait_for(lock, nap_);
      } else {
        workerState_ = WorkerState::kSleeping;
        wake_.wait(lock);
      }
      continue;
    }
    if (grace_.count() > 0 && queue_.size() == 1 && queue_.front().lone && !urgent_ && !stopping_ &&
        !broken_) {
      TimePoint& seen = queue_.front().seen;
      if (seen == TimePoint{}) seen = now;
      const TimePoint due = seen + grace_;
      if (now < due) {
        // A fresh lone operation: its waiter may be about to run it (see tcp_backend.h).
        workerState_ = WorkerState::kNapping;
        ++stats_.workerWaits;
        ++stats_.graceWaits;
        wake_.wait_until(lock, due);
        continue;
      }
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    ++stats_.workerRuns;
    lock.unlock();
    execute(item);
    item = Item{};  // drop the buffers' Work outside the lock
    lock.lock();
    running_ = false;
  }
  workerState_ = WorkerState::kBusy;
}

bool ProcessGroupTcp::runInline(const Work* work) {
  for (;;) {
    Item item;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_ || broken_ || queue_.empty()) return false;
      mine = queue_.front().work.get() == work;
      if (!mine && std::none_of(queue_.begin(), queue_.end(),
                                [&](const Item& i) { return i.work.get() == work; })) {
        return false;  // not queued: running on the worker, or done
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      ++stats_.inlineRuns;
    }
    execute(item);
    item = Item{};
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (queue_.empty()) urgent_ = false;
      wake = workerState_ != WorkerState::kBusy &&
             (!queue_.empty() || broken_ || stopping_ || urgent_);
    }
    if (wake) wake_.notify_all();
    if (mine) return true;
  }
}

void ProcessGroupTcp::wakeForWaiter(const Work* work) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::any_of(queue_.begin(), queue_.end(),
                    [&](const Item& i) { return i.work.get() == work; })) {
      urgent_ = true;
      wake = !running_ && workerState_ != WorkerState::kBusy;
      stats_.waiterWakes += wake;
    }
  }
  if (wake) wake_.notify_all();
}

void ProcessGroupTcp::execute(Item& item) {
  std::string cause;
  if (brokenFlag_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    cause = brokenCause_;
  }
  if (!cause.empty()) {
    item.work->markFailed(std::make_exception_ptr(IoError(
        who() + ": " + item.op.describe() + " was not run: the group failed earlier: " + cause)));
    return;
  }
  if (isCollective(item.op.type) && debugLevel() == DebugLevel::kDetail) {
    try {
      checkSignature(item.op);
    } catch (const InvalidArgumentError&) {
      // A signature mismatch is seen alike by every rank: the op is skipped everywhere and
      // the group stays consistent.
      item.work->markFailed(std::current_exception());
      return;
    } catch (...) {
      item.work->markFailed(handleFailure(item.op, std::current_exception()));
      return;
    }
  }
  if (!isCollective(item.op.type)) {
    runPointToPoint(item);
    return;
  }
  try {
    run(item.op);
    item.work->markCompleted();
  } catch (...) {
    item.work->markFailed(handleFailure(item.op, std::current_exception()));
  }
}

void ProcessGroupTcp::runPointToPoint(Item& first) {
  // The send / recv operations at the head of the queue run as one batch: each is posted on
  // the transport as soon as it reaches the head, and the batch is done when all completed.
  // While waiting, the batch keeps taking send / recv operations that arrive at the head
  // (checked every few milliseconds), so a send posted just before its matching receive (a
  // ring exchange: send to the right, then receive from the left) never waits for a peer
  // that is itself stuck in a send, whatever the message size.
  struct Pending {
    Item item;
    comm::RequestPtr request;
    Deadline deadline;
    bool done = false;
  };
  comm::Transport& transport = ctx_->transport();
  std::vector<Pending> batch;
  const auto post = [&](Item item) {
    const OpDesc& op = item.op;
    // The same wire tag as comm::send / comm::recv, so a group's send matches a comm::recv.
    const uint64_t tag = comm::pointToPointTag(op.tag);
    const size_t bytes = op.count * dtypeSize(op.dtype);
    Deadline deadline(op.timeout);
    batch.push_back(Pending{std::move(item), nullptr, deadline, false});
    batch.back().request = op.type == OpType::kSend
                               ? transport.isend(op.root, op.in.data, bytes, tag)
                               : transport.irecv(op.root, op.out.data, bytes, tag);
  };
  const auto absorb = [&] {
    std::vector<Item> more;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!queue_.empty() && !isCollective(queue_.front().op.type) && !broken_) {
        more.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (auto& item : more) post(std::move(item));
  };

  size_t current = 0;  // the operation an error is attributed to
  milliseconds slice = kP2PSliceMin;
  const OpDesc firstOp = first.op;
  const std::shared_ptr<Work> firstWork = first.work;
  try {
    post(std::move(first));
    absorb();
    for (;;) {
      bool allDone = true;
      bool progress = false;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].done) continue;
        current = i;
        if (batch[i].request->test()) {
          batch[i].done = true;
          batch[i].item.work->markCompleted();
          progress = true;
        } else {
          allDone = false;
        }
      }
      if (allDone) return;
      const size_t before = batch.size();
      absorb();
      progress = progress || batch.size() != before;
      slice = progress ? kP2PSliceMin : std::min(slice * 2, kP2PSliceMax);
      size_t next = 0;
      while (batch[next].done) ++next;
      current = next;
      Pending& p = batch[next];
      if (p.deadline.expired()) {
        const OpDesc& op = p.item.op;
        throw TimeoutError(who() + ": " + op.describe() + " timed out after " +
                           std::to_string(op.timeout.count()) + " ms waiting to " +
                           (op.type == OpType::kSend ? "send to" : "receive from") + " rank " +
                           std::to_string(op.root) + " (" + transport.peerAddress(op.root) +
                           "): " + std::to_string(p.request->bytesOutstanding()) + " of " +
                           std::to_string(p.request->bytes()) + " bytes outstanding (tag " +
                           std::to_string(op.tag) + ")");
      }
      p.request->wait(Deadline(std::min(p.deadline.remaining(), slice)));
    }
  } catch (...) {
    if (batch.empty()) {
      firstWork->markFailed(handleFailure(firstOp, std::current_exception()));
      return;
    }
    auto error = handleFailure(batch[current].item.op, std::current_exception());
    for (auto& p : batch) {
      if (!p.done) p.item.work->markFailed(error);
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

  // Publish, then close our connections so the peers blocked on us fail now, then collect
  // the other ranks' reports; every step bounded by the window.
  const milliseconds window = std::min(options().failureReportWindow, op.timeout / 2);
  const auto start = Clock::now();
  auto exchange = FailureExchange::start(
      store(), rank(), size(), std::string(timedOut ? "timeout" : "io") + "\n" + own, window, true);
  if (exchange) exchange->waitFor(exchange->published, start + window);
  {
    std::shared_ptr<comm::Context> closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = std::move(ctx_);
    }
  }

  std::string message = own;
  bool anyTimeout = timedOut;
  if (exchange && exchange->waitFor(exchange->done, start + window + storeSlack(window))) {
    std::lock_guard<std::mutex> lock(exchange->mu);
    if (!exchange->silent.empty()) {
      message += "\n  ranks that sent no failure report within " + std::to_string(window.count()) +
                 " ms (dead, stopped, or not at this operation): " + joinRanks(exchange->silent);
    }
    message += exchange->reports;
    if (!exchange->storeError.empty()) {
      message +=
          "\n  (the failure reports could not be read from the store: " + exchange->storeError +
          ")";
    }
    anyTimeout = anyTimeout || exchange->anyTimeout;
  } else {
    message += "\n  (no failure reports: the store did not answer within " +
               std::to_string((window + storeSlack(window)).count()) + " ms)";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    brokenCause_ = message;
  }
  if (anyTimeout) return std::make_exception_ptr(TimeoutError(message));
  return std::make_exception_ptr(IoError(message));
}

}  // namespace loom
