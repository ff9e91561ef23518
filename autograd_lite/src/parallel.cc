// The kernel thread pool (parallel.h).
//
// How it works: a parallel region splits [0, n) into `chunks` ranges of chunkLen(n, grain)
// elements (the last shorter): a function of n and grain only, never of the thread count, so
// fn sees the same ranges however many threads run them (parallel.h says why). The caller
// publishes the region as a Job and bumps `generation_`; sleeping workers wake, and every
// participant (the caller included) claims chunk indices from the job's atomic `next` until none
// is left. The caller then waits until `done` equals `chunks`. One region runs at a time
// (regionMutex_); a second caller that finds the pool busy, a worker that starts a region of
// its own, or a pool of one thread runs the same chunks inline, one after another.
//
// Lock order: regionMutex_ before mutex_.
//
// fork(): pthread_atfork handlers hold both locks across the fork (so no kernel is half-way
// and no lock is held by a thread that will not exist in the child); the child forgets the
// parent's workers (their std::thread objects are parked, never joined) and starts its own at
// its first parallel kernel.
#include "loom/autograd/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace loom::ag {

namespace {

thread_local bool tlsInsideRegion = false;

// At most this many ranges per region, whatever the thread count: enough for the pool to balance
// on a large machine, few enough that claiming them costs nothing next to the work.
constexpr int64_t kMaxChunks = 256;

int64_t chunkLen(int64_t n, int64_t grain) {
  return std::max(grain, (n + kMaxChunks - 1) / kMaxChunks);
}

struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t chunks = 0;
  int64_t chunkLen = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::exception_ptr error;
  std::mutex errorMutex;
};

// Claims and runs chunks of `job` until none is left.
void work(Job& job) {
  const bool outer = tlsInsideRegion;
  tlsInsideRegion = true;
  for (;;) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.chunks) break;
    const int64_t begin = c * job.chunkLen;
    const int64_t end = std::min(job.n, begin + job.chunkLen);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.errorMutex);
      if (!job.error) job.error = std::current_exception();
    }
    job.done.fetch_add(1, std::memory_order_acq_rel);
  }
  tlsInsideRegion = outer;
}

class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static destructors
    return *pool;
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  void setThreads(int n) {
    std::lock_guard<std::mutex> region(regionMutex_);
    stopWorkers();
    threads_.store(n, std::memory_order_relaxed);
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const int64_t len = chunkLen(n, std::max<int64_t>(grain, 1));
    const int64_t chunks = (n + len - 1) / len;
    std::unique_lock<std::mutex> region(regionMutex_, std::defer_lock);
    if (chunks <= 1 || threads() <= 1 || tlsInsideRegion || !region.try_lock()) {
      for (int64_t begin = 0; begin < n; begin += len) fn(begin, std::min(n, begin + len));
      return;
    }
    startWorkers();
    Job job;
    job.fn = &fn;
    job.n = n;
    job.chunkLen = len;
    job.chunks = chunks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    work(job);
    // The workers' chunks are short (one kernel slice): spin briefly, then sleep until the
    // last worker has counted itself out. After that no worker holds &job (they read job_
    // under mutex_ and count themselves in `busy_`).
    for (int spins = 0; spins < 2000; ++spins) {
      if (job.done.load(std::memory_order_acquire) == job.chunks) break;
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      idle_.wait(lock, [&] {
        return busy_ == 0 && job.done.load(std::memory_order_acquire) == job.chunks;
      });
      job_ = nullptr;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  Pool() : threads_(availableCpus()) {
    pthread_atfork([] { instance().beforeFork(); }, [] { instance().afterForkInParent(); },
                   [] { instance().afterForkInChild(); });
  }

  void beforeFork() {
    regionMutex_.lock();
    mutex_.lock();
  }
  void afterForkInParent() {
    mutex_.unlock();
    regionMutex_.unlock();
  }
  void afterForkInChild() {
    // The workers do not exist here; destroying joinable std::thread objects would terminate,
    // so they are parked for good.
    if (!workers_.empty()) new std::vector<std::thread>(std::move(workers_));
    workers_.clear();
    job_ = nullptr;
    busy_ = 0;
    stop_ = false;
    mutex_.unlock();
    regionMutex_.unlock();
  }

  void startWorkers() {
    const int want = threads() - 1;
    while (static_cast<int>(workers_.size()) < want) {
      workers_.emplace_back([this] { workerLoop(); });
    }
  }

  void stopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = false;
  }

  void workerLoop() {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_;
    }
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        if (job == nullptr) continue;
        ++busy_;
      }
      work(*job);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_;
      }
      idle_.notify_all();
    }
  }

  std::atomic<int> threads_;
  std::mutex regionMutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
};

}  // namespace

int availableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return std::max(1u, std::thread::hardware_concurrency());
  }
  return std::max(1, CPU_COUNT(&set));
}

int numThreads() {
  return Pool::instance().threads();
}

void setNumThreads(int n) {
  if (n < 0) {
    throw std::invalid_argument("setNumThreads: thread count must be >= 0 (0: the default, " +
                                std::to_string(availableCpus()) + " CPUs), got " +
                                std::to_string(n));
  }
  Pool::instance().setThreads(n == 0 ? availableCpus() : n);
}

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  Pool::instance().run(n, grain, fn);
}

}  // namespace loom::ag
