#include "mpi/mpi_backend.h"

#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/hash_store.h"
#include "loom/store/prefix_store.h"
#include "mpi/mpi_group.h"
#include "mpi/mpi_runtime.h"
#include "pg_checks.h"
#include "pg_failure.h"
#include "pg_settings.h"
#include "record_hooks.h"

namespace loom {

using mpi_detail::CallGuard;

namespace {

// How the worker waits on a running operation: it yields between tests for the first kSpin,
// then sleeps kNap between tests.
constexpr std::chrono::milliseconds kSpin{2};
constexpr std::chrono::microseconds kNap{50};
// Issue-then-wait costs two thread wake-ups (the worker's, the waiter's): the worker looks at
// the queue for kIdleSpin before it sleeps, and a waiter looks at its Work for kWaitSpin before
// it sleeps, both yielding the CPU, so back-to-back operations mostly skip both.
constexpr std::chrono::microseconds kIdleSpin{50};
constexpr std::chrono::microseconds kWaitSpin{50};

bool isPointToPoint(const OpDesc& op) {
  return op.type == OpType::kSend || op.type == OpType::kRecv;
}

// Work of the mpi backend: completion is pushed by the worker; a bounded wait that expires
// aborts the group (work.h).
class MpiWork final : public Work {
 public:
  MpiWork(const OpDesc& op, int rank, std::weak_ptr<ProcessGroup> group)
      : Work(opTypeName(op.type), op.seq, rank), group_(std::move(group)) {}

  bool wait() override {
    spinBriefly();
    return Work::wait();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout <= std::chrono::milliseconds::zero()) return wait();  // c10d's kNoTimeout
    spinBriefly();
    return Work::wait(timeout);
  }

 protected:
  void onWaitTimeout(const std::string& reason) override {
    if (auto group = group_.lock()) group->abort(reason);
  }

 private:
  void spinBriefly() {
    const auto until = Clock::now() + kWaitSpin;
    while (!isCompleted() && Clock::now() < until) std::this_thread::yield();
  }

  std::weak_ptr<ProcessGroup> group_;
};

// A duplicate of `comm` that returns MPI errors as codes, waited for until `deadline`.
// MPI writes what a non-blocking call returns (the new communicator, the received data) when
// the call completes, however late: when the wait for it times out, that memory is left
// allocated (`state.release()`), never freed under MPI.
template <typename T>
void waitOrLeak(std::unique_ptr<T>& state, MPI_Request& request, const Deadline& deadline,
                const std::string& who, const std::string& what) {
  try {
    mpi_detail::waitRequest(request, deadline, who, what);
  } catch (const TimeoutError& e) {
    // Some rank did not join: MPI_Finalize at exit may wait for it (noteGroupFailure).
    mpi_detail::noteGroupFailure(e.what(), deadline.elapsed());
    // MPI may still write into it: never freed, and LeakSanitizer is told so.
    T* leaked = state.release();
#if defined(__SANITIZE_ADDRESS__)
    __lsan_ignore_object(leaked);
#else
    static_cast<void>(leaked);
#endif
    throw;
  }
}

// A duplicate of `comm` that returns MPI errors as codes, waited for until `deadline`.
MPI_Comm duplicate(MPI_Comm comm, const Deadline& deadline, const std::string& who) {
  auto dup = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  {
    CallGuard guard;
    mpi_detail::check(MPI_Comm_idup(comm, dup.get(), &request), who, "MPI_Comm_idup");
  }
  waitOrLeak(dup, request, deadline, who,
             "creating the group's communicator (MPI_Comm_idup: every rank of the group must "
             "create the group)");
  CallGuard guard;
  mpi_detail::check(MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN), who,
                    "MPI_Comm_set_errhandler");
  return *dup;
}

void checkCount(const ProcessGroup& pg, const OpDesc& op, size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX)) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opTypeName(op.type), ": ", what, " of ", count,
               " elements is more than MPI's C int counts take (", INT_MAX,
               "); split the operation or use the tcp backend");
  }
}

// Counts per rank and their running sums (MPI's displacements) must fit MPI's ints.
void checkCounts(const ProcessGroup& pg, const OpDesc& op, const std::vector<size_t>& counts,
                 const char* what) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  checkCount(pg, op, total, what);
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

}  // namespace

namespace mpi_detail {

void waitRequest(MPI_Request& request, const Deadline& deadline, const std::string& who,
                 const std::string& what) {
  const auto began = Clock::now();
  for (;;) {
    int done = 0;
    {
      CallGuard guard;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), who, what);
    }
    if (done) return;
    if (deadline.expired()) {
      LOOM_THROW(TimeoutError, who, ": ", what, " did not complete within ",
                 deadline.elapsed().count(), " ms");
    }
    if (Clock::now() - began < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kNap);
    }
  }
}

}  // namespace mpi_detail

ProcessGroupMpi::ProcessGroupMpi(std::shared_ptr<Store> store, bool sharedStore, int rank, int size,
                                 const ProcessGroupOptions& options, MPI_Comm comm)
    : ProcessGroup("mpi", std::move(store), rank, size, options),
      sharedStore_(sharedStore),
      comm_(comm) {
  try {
    control_ = duplicate(comm_, Deadline(options.timeout), who());
  } catch (...) {
    CallGuard guard;
    MPI_Comm_free(&comm_);
    throw;
  }
  const MpiWorld& world = mpi_detail::ensureInitialized();
  // "mpi (Open MPI v4.1.4, MPI_THREAD_MULTIPLE)": the library's name and version only.
  summary_ =
      "mpi (" + world.library.substr(0, world.library.find(',')) + ", " + world.threadLevel + ")";
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupMpi::~ProcessGroupMpi() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  leave();
  if (mpi_detail::finalized()) {
    LOOM_LOG_WARNING(who(),
                     ": mpi group destroyed after MPI_Finalize; its communicators were "
                     "not freed (destroy mpi groups before the program ends)");
    for (auto& r : abandoned_) static_cast<void>(r.release());
    return;
  }
  CallGuard guard;
  // What MPI completed since it was abandoned is released; what it still holds stays
  // allocated, since MPI may still write it.
  for (auto& r : abandoned_) {
    int done = 1;
    for (MPI_Request& request : r->requests) {
      int flag = 0;
      if (request != MPI_REQUEST_NULL &&
          MPI_Test(&request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) {
        done = 0;
      }
    }
    if (!done) static_cast<void>(r.release());
  }
  MPI_Comm_free(&control_);
  MPI_Comm_free(&comm_);
}

std::string ProcessGroupMpi::transportSummary() const {
  return summary_;
}

void ProcessGroupMpi::checkDevice(const BufferView& buf, const char* opName) const {
  if (buf.device.type != DeviceType::kCpu) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName,
               ": the mpi backend takes CPU buffers (Debian's Open MPI is not CUDA-aware), got a ",
               deviceName(buf.device), " buffer (use the nccl backend for CUDA memory)");
  }
}

void ProcessGroupMpi::checkOp(const OpDesc& op) const {
  const char* name = opTypeName(op.type);
  switch (op.type) {
    case OpType::kSend:
    case OpType::kRecv:
      if (op.tag > static_cast<uint64_t>(mpi_detail::tagUpperBound())) {
        LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": tag ", op.tag,
                   " is larger than MPI's largest tag (MPI_TAG_UB = ", mpi_detail::tagUpperBound(),
                   ")");
      }
      break;
    case OpType::kMonitoredBarrier:
      if (!sharedStore_) {
        LOOM_THROW(InvalidArgumentError, who(),
                   ": monitored_barrier goes through the group's store, and this mpi group was "
                   "created without one (null store, or initProcessGroup without MASTER_ADDR); "
                   "pass a store shared by the ranks to createProcessGroup, or use barrier()");
      }
      break;
    default:
      break;
  }
  checkCount(*this, op, op.count, "a count");
  checkCounts(*this, op, op.inCounts, "the counts' total");
  checkCounts(*this, op, op.outCounts, "the output splits' total");
  if (op.type == OpType::kAllgather || op.type == OpType::kGather || op.type == OpType::kScatter ||
      op.type == OpType::kAlltoall) {
    checkCount(*this, op, op.count * static_cast<size_t>(size()), "the total");
  }
}

bool ProcessGroupMpi::isBroken() const {
  return broken_.load(std::memory_order_acquire);
}

std::string ProcessGroupMpi::markBroken(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.load(std::memory_order_relaxed)) {
    cause_ = cause;
    broken_.store(true, std::memory_order_release);
    mpi_detail::noteGroupFailure(cause, options().timeout);
  }
  return cause_;
}

std::string ProcessGroupMpi::brokenCause() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cause_;
}

std::exception_ptr ProcessGroupMpi::notRun(const OpDesc& op) const {
  return std::make_exception_ptr(IoError(
      who() + ": " + op.describe() + " was not run: the group failed earlier: " + brokenCause()));
}

void ProcessGroupMpi::abort(const std::string& reason) {
  const std::string cause = who() + ": aborted: " + reason;
  const bool first = markBroken(cause) == cause;
  wake_.notify_all();
  // As the comm backend does: the abort's report and flight record go to the shared store (on
  // the exchange's own thread: abort() never waits), for the ranks that fail later and for
  // loom-doctor.
  if (first && sharedStore_) {
    const milliseconds window = std::min(options().failureReportWindow, options().timeout / 2);
    pg_failure::FailureExchange::start(
        store(), rank(), size(), "io\n" + cause,
        diagnostics() ? diagnostics()->dumpLocal("abort", diag::GroupDiagnostics::kFailureEntries)
                      : "",
        window, false);
  }
}

std::shared_ptr<Work> ProcessGroupMpi::post(OpDesc&& op) {
  auto work = std::make_shared<MpiWork>(op, rank(), weak_from_this());
  if (isBroken()) {
    recordEnd(op, true);
    work->markFailed(notRun(op));
    return work;
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Item{std::move(op), work});
    queued_.store(queue_.size(), std::memory_order_release);
    wake = workerSleeps_;
  }
  if (wake) wake_.notify_one();
  return work;
}

void ProcessGroupMpi::workerLoop() {
  std::vector<std::unique_ptr<Running>> running;
  auto lastProgress = Clock::now();
  for (;;) {
    std::vector<Item> taken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (running.empty() && queue_.empty() && !stopping_) {
        lock.unlock();
        const auto until = Clock::now() + kIdleSpin;
        while (queued_.load(std::memory_order_acquire) == 0 && Clock::now() < until) {
          std::this_thread::yield();
        }
        lock.lock();
        workerSleeps_ = true;
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        workerSleeps_ = false;
      }
      if (running.empty() && queue_.empty() && stopping_) return;
      // What may start now: the head when nothing runs; send / recv behind a running batch of
      // send / recv (a collective waits until the batch completed).
      bool batch = !running.empty();
      bool batchIsP2P = batch && running.front()->pointToPoint;
      while (!queue_.empty()) {
        const bool p2p = isPointToPoint(queue_.front().op);
        if (batch && (!p2p || !batchIsP2P)) break;
        taken.push_back(std::move(queue_.front()));
        queue_.pop_front();
        queued_.store(queue_.size(), std::memory_order_release);
        batch = true;
        batchIsP2P = p2p;
        if (!p2p) break;
      }
    }
    if (!taken.empty()) lastProgress = Clock::now();
    for (Item& item : taken) {
      if (isBroken()) {
        recordEnd(item.op, true);
        item.work->markFailed(notRun(item.op));
        continue;
      }
      auto r = std::make_unique<Running>();
      r->deadline = Deadline(item.op.timeout);
      r->pointToPoint = isPointToPoint(item.op);
      r->op = std::move(item.op);
      r->work = std::move(item.work);
      if (isCollective(r->op.type) && debugLevel() == DebugLevel::kDetail) {
        try {
          checkSignature(r->op);
        } catch (const InvalidArgumentError&) {
          // Every rank sees the mismatch alike: the operation is skipped everywhere and the
          // group stays usable.
          recordEnd(r->op, true);
          r->work->markFailed(std::current_exception());
          continue;
        } catch (const std::exception& e) {
          failOne(*r, e.what());
          continue;
        }
      }
      recordStart(r->op);
      try {
        start(*r);
        running.push_back(std::move(r));
      } catch (const std::exception& e) {
        failOne(*r, e.what());
        abandoned_.push_back(std::move(r));
      }
    }
    // Test what runs; the first failure breaks the group and fails the rest.
    bool progress = false;
    for (size_t i = 0; i < running.size() && !isBroken();) {
      Running& r = *running[i];
      try {
        if (test(r)) {
          recordEnd(r.op, false);
          r.work->markCompleted();
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
          progress = true;
          continue;
        }
        if (r.deadline.expired()) throw TimeoutError(timeoutMessage(r));
        ++i;
      } catch (const std::exception& e) {
        failOne(r, e.what());
        abandoned_.push_back(std::move(running[i]));
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (isBroken() && !running.empty()) failRunning(running);
    if (running.empty()) continue;
    if (progress) lastProgress = Clock::now();
    if (Clock::now() - lastProgress < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kNap);
    }
  }
}

void ProcessGroupMpi::checkSignature(const OpDesc& op) {
  if (sharedStore_) {
    pg_failure::checkSignatureInStore(*this, op, lastSignatureSeq_);
    return;
  }
  // No store: every rank's signature text (truncated to kBytes) by MPI_Iallgather on the
  // group's communicator, which every rank in DETAIL mode calls before each collective, so the
  // calls line up. MPI may write the buffers until every rank joined: a timed-out exchange
  // leaves them allocated (waitOrLeak).
  constexpr size_t kBytes = 256;
  struct Exchange {
    char mine[kBytes] = {};
    std::vector<char> all;
  };
  auto exchange = std::make_unique<Exchange>();
  exchange->all.assign(kBytes * static_cast<size_t>(size()), '\0');
  const std::string mine = op.signature().substr(0, kBytes - 1);
  std::memcpy(exchange->mine, mine.data(), mine.size());
  MPI_Request request = MPI_REQUEST_NULL;
  {
    CallGuard guard;
    mpi_detail::check(
        MPI_Iallgather(exchange->mine, static_cast<int>(kBytes), MPI_CHAR, exchange->all.data(),
                       static_cast<int>(kBytes), MPI_CHAR, comm_, &request),
        who(), op.describe() + " (LOOM_DEBUG=DETAIL signature check, MPI_Iallgather)");
  }
  waitOrLeak(exchange, request, Deadline(op.timeout), who(),
             op.describe() +
                 " (LOOM_DEBUG=DETAIL signature check over MPI: this group has no store, so the "
                 "ranks that did not reach collective #" +
                 std::to_string(op.seq) + " cannot be named)");
  std::vector<std::string> signatures;
  for (int rank = 0; rank < size(); ++rank) {
    signatures.emplace_back(exchange->all.data() + kBytes * static_cast<size_t>(rank));
  }
  pg_failure::compareSignatures(*this, op, signatures);
}

std::string ProcessGroupMpi::timeoutMessage(const Running& r) const {
  const size_t bytes = r.op.count * dtypeSize(r.op.dtype);
  std::string peer;
  if (r.pointToPoint) {
    peer = r.op.type == OpType::kSend ? " sending to " : " receiving from ";
    peer += r.op.root == kAnySource ? "any rank" : "rank " + std::to_string(r.op.root);
  }
  return who() + ": " + r.op.describe() + " timed out after " +
         std::to_string(r.op.timeout.count()) + " ms" + peer + " (" + std::to_string(bytes) +
         " bytes; its MPI request is still pending: some rank has not reached it)";
}

void ProcessGroupMpi::failOne(Running& r, const std::string& what) {
  // The exception being handled is the operation's error; the group takes its message.
  markBroken(what);
  recordEnd(r.op, true, r.pointToPoint ? r.op.root : -1);
  if (sharedStore_) {
    // Like the comm backend (pg_failure.h): this rank's report and flight record through the
    // store, the other ranks' reports and the analysis back, within the report window. MPI
    // cannot cancel a collective, so nothing is cut loose here: the peers fail on their own
    // deadlines, and find this rank's report then.
    const std::exception_ptr error = std::current_exception();
    const pg_failure::FailureCause cause = pg_failure::classify(error);
    const pg_failure::FailureOutcome outcome = pg_failure::exchangeReports(
        *this, r.op, cause, pg_failure::ownMessage(*this, r.op, cause.what),
        diagnostics() ? diagnostics()->dumpLocal("failure", diag::GroupDiagnostics::kFailureEntries)
                      : "",
        {});
    {
      // The group's cause becomes the whole story when this failure broke it.
      std::lock_guard<std::mutex> lock(mu_);
      if (cause_ == what) cause_ = outcome.message;
    }
    r.work->markFailed(outcome.error());
  } else {
    r.work->markFailed(std::current_exception());
  }
  // A receive is cancelled; a collective cannot be and a send need not be: MPI keeps them.
  if (r.pointToPoint && r.op.type == OpType::kRecv) {
    CallGuard guard;
    for (MPI_Request& request : r.requests) {
      if (request != MPI_REQUEST_NULL) MPI_Cancel(&request);
    }
  }
}

void ProcessGroupMpi::failRunning(std::vector<std::unique_ptr<Running>>& running) {
  CallGuard guard;
  for (auto& r : running) {
    for (MPI_Request& request : r->requests) {
      if (request != MPI_REQUEST_NULL && r->pointToPoint && r->op.type == OpType::kRecv) {
        MPI_Cancel(&request);
      }
    }
    recordEnd(r->op, true);
    r->work->markFailed(
        std::make_exception_ptr(IoError(who() + ": " + r->op.describe() +
                                        " did not complete: the group failed: " + brokenCause())));
    abandoned_.push_back(std::move(r));
  }
  running.clear();
}

bool ProcessGroupMpi::test(Running& r) {
  for (MPI_Request& request : r.requests) {
    if (request == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Status status;
    int rc = MPI_SUCCESS;
    {
      CallGuard guard;
      rc = MPI_Test(&request, &done, &status);
    }
    if (rc != MPI_SUCCESS) {
      LOOM_THROW(IoError, who(), ": ", r.op.describe(), " failed: ",
                 mpi_detail::errorString(rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : rc));
    }
    if (!done) return false;
    if (r.op.type == OpType::kRecv) {
      int got = 0;
      {
        CallGuard guard;
        MPI_Get_count(&status, mpi_detail::datatype(r.op.dtype), &got);
      }
      if (got != static_cast<int>(r.op.count)) {
        LOOM_THROW(IoError, who(), ": ", r.op.describe(), " received ", got, " elements (tag ",
                   r.op.tag, ") from rank ", status.MPI_SOURCE, " but its buffer holds ",
                   r.op.count,
                   "; the send and the receive must have "
                   "the same count");
      }
      r.work->setSourceRank(status.MPI_SOURCE);
    }
  }
  if (r.finish) r.finish();
  return true;
}

std::shared_ptr<ProcessGroup> createProcessGroupMpi(std::shared_ptr<Store> store, int rank,
                                                    int size, const ProcessGroupOptions& options) {
  const MpiWorld& world = mpi_detail::ensureInitialized();
  if (rank != world.rank || size != world.size) {
    LOOM_THROW(InvalidArgumentError, "createProcessGroup(\"mpi\"): rank ", rank, " of size ", size,
               " was passed but MPI_COMM_WORLD says rank ", world.rank, " of size ", world.size,
               "; the mpi backend takes its membership from MPI (pass mpiWorld().rank and "
               ".size, or start the job with mpirun -np ",
               size, ")");
  }
  const bool shared = store != nullptr;
  if (!shared) store = std::make_shared<HashStore>();
  const std::string who = "rank " + std::to_string(rank);
  MPI_Comm comm = duplicate(MPI_COMM_WORLD, Deadline(options.timeout), who);
  return std::make_shared<ProcessGroupMpi>(std::move(store), shared, rank, size, options, comm);
}

std::shared_ptr<ProcessGroup> newGroupMpi(ProcessGroup& parent, const std::vector<int>& ranks,
                                          int id, const ProcessGroupOptions& options) {
  auto* mpiParent = dynamic_cast<ProcessGroupMpi*>(&parent);
  LOOM_CHECK(mpiParent != nullptr, parent.who(), ": newGroup: the parent is not an mpi group");
  const MPI_Comm control = mpiParent->controlComm();
  const std::string list = joinRanks(ranks);
  const std::string who = parent.who();

  // Agreement: every rank's hash of its list, so that differing lists fail on every rank
  // instead of hanging in the split.
  const uint64_t mine = std::hash<std::string>{}(list);
  struct Exchange {
    uint64_t mine;
    std::vector<uint64_t> hashes;
  };
  auto exchange = std::make_unique<Exchange>(
      Exchange{mine, std::vector<uint64_t>(static_cast<size_t>(parent.size()))});
  const std::vector<uint64_t>& hashes = exchange->hashes;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    CallGuard guard;
    mpi_detail::check(MPI_Iallgather(&exchange->mine, 1, MPI_UINT64_T, exchange->hashes.data(), 1,
                                     MPI_UINT64_T, control, &request),
                      who, "newGroup (MPI_Iallgather)");
  }
  waitOrLeak(exchange, request, Deadline(options.timeout), who,
             "newGroup #" + std::to_string(id) +
                 ": waiting for every rank of the parent group to call newGroup");
  std::map<uint64_t, std::vector<int>> byList;
  for (int r = 0; r < parent.size(); ++r) byList[hashes[static_cast<size_t>(r)]].push_back(r);
  if (byList.size() > 1) {
    std::vector<int> same, other;
    for (const auto& [hash, rs] : byList) {
      std::vector<int>& into = hash == mine ? same : other;
      into.insert(into.end(), rs.begin(), rs.end());
    }
    LOOM_THROW(InvalidArgumentError, who, ": newGroup #", id, ": this rank passed ranks [", list,
               "], as did ranks [", joinRanks(same), "], but ranks [", joinRanks(other),
               "] passed a different list; every rank must pass the same list");
  }

  const auto it = std::find(ranks.begin(), ranks.end(), parent.rank());
  const bool member = it != ranks.end();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    // Blocking (MPI has no non-blocking split), but every rank of the parent has entered
    // newGroup (the all-gather above). A rank whose wait for that all-gather timed out as the
    // others' completed leaves them here: it noted the failure, so when it exits its
    // MPI_Finalize gives up after the timeout, and mpirun then ends the job (noteGroupFailure).
    CallGuard guard;
    mpi_detail::check(MPI_Comm_split(control, member ? 0 : MPI_UNDEFINED, parent.rank(), &comm),
                      who, "newGroup #" + std::to_string(id) + " (MPI_Comm_split)");
  }
  if (!member) return nullptr;

  const std::string name = "group/" + std::to_string(id);
  ProcessGroupOptions subOptions = options;
  subOptions.parentRanks = ranks;
  if (subOptions.groupName.empty()) {
    const std::string& parentName = parent.options().groupName;
    subOptions.groupName = parentName.empty() ? name : parentName + "/" + name;
  }
  std::shared_ptr<Store> store;
  if (mpiParent->sharedStore()) {
    store = std::make_shared<PrefixStore>(name, parent.store());
  } else {
    store = std::make_shared<HashStore>();
  }
  const int subRank = static_cast<int>(it - ranks.begin());
  auto pg = std::make_shared<ProcessGroupMpi>(std::move(store), mpiParent->sharedStore(), subRank,
                                              static_cast<int>(ranks.size()), subOptions, comm);
  logGroupReady(*pg);
  return pg;
}

}  // namespace loom
