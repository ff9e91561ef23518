#include "mpi/mpi_runtime.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "loom/comm/reduce.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom::mpi_detail {

namespace {

std::mutex& callMutex() {
  static std::mutex mu;
  return mu;
}

// Set once by ensureInitialized (under its mutex) and read-only afterwards.
struct Runtime {
  MpiWorld world;
  bool serialized = false;  // MPI_THREAD_SERIALIZED: CallGuard locks
  int tagUb = 32767;        // the MPI standard's minimum, until MPI_TAG_UB is read
  MPI_Datatype half = MPI_DATATYPE_NULL;
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  // User ops for float16 and bfloat16: sum (avg too), prod, min, max.
  MPI_Op halfOps[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bfloat16Ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

const char* threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// MPI's user-op signature over Loom's kernels: inout[i] = in[i] (op) inout[i].
template <DType kDtype, ReduceOp kOp>
void halfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  static const comm::ReduceFn fn = comm::reduceFunction(kDtype, kOp);
  fn(inout, in, inout, static_cast<size_t>(*len));
}

constexpr ReduceOp kHalfOps[4] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};

template <DType kDtype>
void createHalfOps(MPI_Op (&ops)[4]) {
  MPI_User_function* fns[4] = {
      &halfReduce<kDtype, ReduceOp::kSum>, &halfReduce<kDtype, ReduceOp::kProd>,
      &halfReduce<kDtype, ReduceOp::kMin>, &halfReduce<kDtype, ReduceOp::kMax>};
  for (int i = 0; i < 4; ++i) {
    check(MPI_Op_create(fns[i], /*commute=*/1, &ops[i]), "mpi backend", "MPI_Op_create");
  }
}

MPI_Datatype createHalfType(const char* name) {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  check(MPI_Type_contiguous(2, MPI_BYTE, &type), "mpi backend", "MPI_Type_contiguous");
  check(MPI_Type_commit(&type), "mpi backend", "MPI_Type_commit");
  MPI_Type_set_name(type, name);
  return type;
}

struct FailureNote {
  std::mutex mu;
  std::string cause;  // the first failure; "" while none
  std::chrono::milliseconds timeout{0};
};

FailureNote& failureNote() {
  static auto* note = new FailureNote;  // never destroyed: read by the atexit handler
  return *note;
}

// Ends the process with status 1 if MPI_Finalize has not returned within `bound` (see
// noteGroupFailure). One per process (finalizeAtExit runs once); its state is never freed and
// stays reachable (a static pointer): the thread may outlive main's statics, and leak checkers
// stay quiet.
class FinalizeWatchdog {
 public:
  FinalizeWatchdog(std::string cause, std::chrono::milliseconds bound) : state_(sharedState()) {
    State* state = state_;
    std::thread([state, cause = std::move(cause), bound] {
      std::unique_lock<std::mutex> lock(state->mu);
      if (state->cv.wait_for(lock, bound, [state] { return state->returned; })) return;
      LOOM_LOG_ERROR("mpi backend: MPI_Finalize did not return within ", bound.count(),
                     " ms (the failed group's timeout) after an mpi group of this process failed (",
                     cause,
                     "): a rank has not reached MPI_Finalize, stuck in the failure or still "
                     "running; exiting with status 1 without it, so that mpirun ends the job");
      std::fflush(nullptr);
      ::_exit(1);
    }).detach();
  }
  ~FinalizeWatchdog() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->returned = true;
    state_->cv.notify_all();
  }
  FinalizeWatchdog(const FinalizeWatchdog&) = delete;
  FinalizeWatchdog& operator=(const FinalizeWatchdog&) = delete;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool returned = false;
  };
  static State* sharedState() {
    static auto* state = new State;
    return state;
  }
  State* state_;
};

// Registered with atexit when Loom initialized MPI.
void finalizeAtExit() {
  int done = 0;
  MPI_Finalized(&done);
  if (done) return;
  const auto [failure, bound] = groupFailure();
  std::optional<FinalizeWatchdog> watchdog;
  if (!failure.empty()) {
    LOOM_LOG_INFO(
        "mpi backend: finalizing MPI after an mpi group of this process failed; "
        "waiting at most ",
        bound.count(), " ms for every rank to reach MPI_Finalize");
    watchdog.emplace(failure, bound);
  }
  Runtime& r = runtime();
  for (MPI_Op* ops : {r.halfOps, r.bfloat16Ops}) {
    for (int i = 0; i < 4; ++i) {
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
    }
  }
  if (r.half != MPI_DATATYPE_NULL) MPI_Type_free(&r.half);
  if (r.bfloat16 != MPI_DATATYPE_NULL) MPI_Type_free(&r.bfloat16);
  MPI_Finalize();
}

}  // namespace

void noteGroupFailure(const std::string& cause, std::chrono::milliseconds timeout) {
  FailureNote& note = failureNote();
  std::lock_guard<std::mutex> lock(note.mu);
  if (!note.cause.empty()) return;
  note.cause = cause.empty() ? "(no reason given)" : cause;
  note.timeout = std::max(timeout, std::chrono::milliseconds(1000));
}

std::pair<std::string, std::chrono::milliseconds> groupFailure() {
  FailureNote& note = failureNote();
  std::lock_guard<std::mutex> lock(note.mu);
  return {note.cause, note.timeout};
}

namespace {

void initialize(Runtime& r) {
  int initialized = 0, done = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&done);
  if (done) {
    LOOM_THROW(NotAvailableError,
               "mpi backend: MPI was finalized already; MPI cannot be initialized twice in "
               "one process");
  }
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      LOOM_THROW(NotAvailableError, "mpi backend: MPI_Init_thread failed: ", errorString(rc));
    }
    r.world.initializedByLoom = true;
    // Errors on MPI_COMM_WORLD (and on the communicators duplicated from it) come back as
    // codes, turned into exceptions, instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(&finalizeAtExit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    LOOM_THROW(NotAvailableError, "mpi backend: MPI provides ", threadLevelName(provided),
               "; the backend calls MPI from its worker thread and needs MPI_THREAD_SERIALIZED "
               "or MPI_THREAD_MULTIPLE (initialize MPI with MPI_Init_thread asking for "
               "MPI_THREAD_MULTIPLE, or let Loom initialize it)");
  }
  r.serialized = provided < MPI_THREAD_MULTIPLE;
  r.world.threadLevel = threadLevelName(provided);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &r.world.rank), "mpi backend", "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &r.world.size), "mpi backend", "MPI_Comm_size");
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(version, &len) == MPI_SUCCESS) {
    std::string v(version, static_cast<size_t>(len));
    r.world.library = v.substr(0, v.find_first_of("\r\n"));
  }
  void* ub = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found) == MPI_SUCCESS && found) {
    r.tagUb = *static_cast<int*>(ub);
  }
  r.half = createHalfType("loom_float16");
  r.bfloat16 = createHalfType("loom_bfloat16");
  createHalfOps<DType::kFloat16>(r.halfOps);
  createHalfOps<DType::kBFloat16>(r.bfloat16Ops);
}

int halfOpIndex(ReduceOp op) {
  for (int i = 0; i < 4; ++i) {
    if (kHalfOps[i] == op) return i;
  }
  return 0;  // avg: the sum
}

}  // namespace

// A mutex and a flag, not std::call_once: initialize() throws when MPI's thread level is too low,
// and a later call must try again (and throw again). An exception out of std::call_once leaves
// its flag "in progress" where pthread_once does not unwind (ThreadSanitizer's interceptor, some
// libcs), and the next call waited forever: pg_mpi_funneled_test hung under TSan.
const MpiWorld& ensureInitialized() {
  static std::mutex mu;
  static std::atomic<bool> done{false};
  Runtime& r = runtime();
  if (done.load(std::memory_order_acquire)) return r.world;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.load(std::memory_order_relaxed)) {
    initialize(r);
    done.store(true, std::memory_order_release);
  }
  return r.world;
}

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

CallGuard::CallGuard() {
  if (runtime().serialized) lock_ = std::unique_lock<std::mutex>(callMutex());
}

std::string errorString(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<size_t>(len)) + " (MPI error code " + std::to_string(code) +
         ")";
}

void check(int code, const std::string& who, const std::string& what) {
  if (code != MPI_SUCCESS) LOOM_THROW(IoError, who, ": ", what, " failed: ", errorString(code));
}

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kFloat16:
      return runtime().half;
    case DType::kBFloat16:
      return runtime().bfloat16;
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kBool:
      return MPI_C_BOOL;
  }
  return MPI_BYTE;
}

MPI_Op reduceOp(ReduceOp op, DType dtype) {
  if (dtype == DType::kFloat16) return runtime().halfOps[halfOpIndex(op)];
  if (dtype == DType::kBFloat16) return runtime().bfloat16Ops[halfOpIndex(op)];
  if (dtype == DType::kBool) {
    switch (op) {
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return MPI_LAND;
      case ReduceOp::kBxor:
        return MPI_LXOR;
      default:
        return MPI_LOR;
    }
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kBand:
      return MPI_BAND;
    case ReduceOp::kBor:
      return MPI_BOR;
    case ReduceOp::kBxor:
      return MPI_BXOR;
  }
  return MPI_SUM;
}

int tagUpperBound() {
  return runtime().tagUb;
}

}  // namespace loom::mpi_detail

namespace loom {

MpiWorld mpiWorld() {
  return mpi_detail::ensureInitialized();
}

}  // namespace loom
