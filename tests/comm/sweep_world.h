// Parameterized sweeps: every case (collective x world size x count x dtype x op) is its own
// gtest test, named like `Sweep/Reduce.Allreduce/ws4_count1000_float_sum`, so that one
// mismatch hides no other case.
//
// World: `size` thread ranks, each with its own Context over one HashStore and its own
// Checker, kept alive between cases and running one job at a time on every rank. Building a
// world (threads, connections, an shm arena) costs more than most cases, so a SweepTest
// suite keeps one world per size until the suite ends (gtest runs a suite's cases test by
// test, each over every size). Inside a job the Checker records mismatches instead of
// throwing, so every rank issues every collective of the case and the world stays in step;
// run() returns them, SweepTest::check reports each one. Anything else a rank raises (an
// IoError, a timeout: the Checker's collectives time out after 60 s) leaves the world broken:
// run() rethrows it with the rank, and the next case builds a new world.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sweep.h"

namespace loom::comm::testing {

class World {
 public:
  using Job = std::function<void(Checker&)>;

  // Every rank's Context is made with testOptions(base) (test_paths.h).
  explicit World(int size, const ContextOptions& base = {}) : size_(size), base_(base) {
    pending_ = size;
    for (int rank = 0; rank < size; ++rank) threads_.emplace_back([this, rank] { rankMain(rank); });
    waitForRanks();
    if (!error_.empty()) {
      stop();
      throw std::runtime_error(error_);
    }
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() { stop(); }

  int size() const { return size_; }
  bool broken() const { return broken_; }

  // Runs job on every rank and returns every mismatch the ranks recorded; rethrows the first
  // other error (prefixed with its rank) and marks the world broken.
  std::vector<std::string> run(const Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = size_;
      mismatches_.clear();
      error_.clear();
      ++generation_;
    }
    wake_.notify_all();
    waitForRanks();
    if (!error_.empty()) {
      broken_ = true;
      throw std::runtime_error(error_);
    }
    return std::move(mismatches_);
  }

 private:
  void rankMain(int rank) {
    std::shared_ptr<Context> ctx;
    std::unique_ptr<Checker> check;
    std::vector<std::string> mismatches;
    finish(rank, guarded([&] {
             ContextOptions options = testOptions(base_);
             options.timeout = std::chrono::seconds(60);
             ctx = Context::create(store_, rank, size_, options);
             check = std::make_unique<Checker>(*ctx);
             check->recordMismatchesIn(&mismatches);
           }),
           mismatches);
    for (uint64_t seen = 0;;) {
      const Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) break;
        seen = generation_;
        job = job_;
      }
      std::string error = check ? guarded([&] { (*job)(*check); }) : "no context";
      finish(rank, error, mismatches);
    }
  }

  static std::string guarded(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown exception";
    }
    return "";
  }

  void finish(int rank, const std::string& error, std::vector<std::string>& mismatches) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& m : mismatches) mismatches_.push_back(std::move(m));
    mismatches.clear();
    if (!error.empty() && error_.empty()) error_ = "rank " + std::to_string(rank) + ": " + error;
    if (--pending_ == 0) done_.notify_all();
  }

  void waitForRanks() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  const int size_;
  const ContextOptions base_;
  HashStore store_;
  std::mutex mu_;
  std::condition_variable wake_;  // ranks: a new job, or stop
  std::condition_variable done_;  // run(): every rank finished the job
  const Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  bool broken_ = false;
  std::vector<std::string> mismatches_;
  std::string error_;
  std::vector<std::thread> threads_;
};

// One case of a sweep; `op` only for the reducing collectives.
struct SweepCase {
  int size;
  DType dtype;
  size_t count;
  std::optional<ReduceOp> op;
};

inline void PrintTo(const SweepCase& c, std::ostream* os) {
  *os << "world size " << c.size << ", count " << c.count << ", " << dtypeName(c.dtype);
  if (c.op) *os << ", " << reduceOpName(*c.op);
}

inline std::string sweepCaseName(const ::testing::TestParamInfo<SweepCase>& info) {
  const SweepCase& c = info.param;
  std::string name = detail::str("ws", c.size, "_count", c.count, "_", dtypeName(c.dtype));
  if (c.op) name += detail::str("_", reduceOpName(*c.op));
  return name;
}

// World size x count x dtype (x every valid op when withOps), world size outermost.
inline std::vector<SweepCase> sweepCases(const std::vector<int>& sizes,
                                         const std::function<std::vector<size_t>(int)>& counts,
                                         bool withOps,
                                         const std::vector<DType>& dtypes = allDTypes()) {
  std::vector<SweepCase> cases;
  for (int size : sizes) {
    for (size_t count : counts(size)) {
      for (DType dtype : dtypes) {
        if (!withOps) {
          cases.push_back({size, dtype, count, std::nullopt});
          continue;
        }
        for (ReduceOp op : validOps(dtype)) cases.push_back({size, dtype, count, op});
      }
    }
  }
  return cases;
}

class SweepTest : public ::testing::TestWithParam<SweepCase> {
 public:
  static void TearDownTestSuite() { worlds().clear(); }

 protected:
  // The options the suite's worlds are made with (before testOptions adjusts them).
  virtual ContextOptions worldOptions() const { return {}; }
  const SweepCase& param() const { return GetParam(); }
  ReduceOp op() const { return GetParam().op.value_or(ReduceOp::kSum); }

  // Runs job on every rank of a world of the case's size and reports every mismatch.
  void check(const World::Job& job) {
    auto& w = worlds()[param().size];
    if (!w || w->broken()) {
      w.reset();
      w = std::make_unique<World>(param().size, worldOptions());
    }
    for (const auto& mismatch : w->run(job)) ADD_FAILURE() << mismatch;
  }

 private:
  static std::map<int, std::unique_ptr<World>>& worlds() {
    static std::map<int, std::unique_ptr<World>> w;
    return w;
  }
};

}  // namespace loom::comm::testing
