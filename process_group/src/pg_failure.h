// What a backend with a store shared by its ranks does when its ranks' calls disagree or an
// operation fails: LOOM_DEBUG=DETAIL's signature check through the store, and the failure-report
// exchange (every rank's report and flight record through the store, the analysis on the spot)
// whose outcome becomes the error of every rank. Shared by the comm backend (comm_backend.cc,
// comm_handoff.cc) and the mpi backend (mpi/mpi_backend.cc). Private to loom_process_group.
//
// Store keys (under the group's store): failure/<rank> (the report: "invalid|timeout|io\n"
// + message), sig/<seq>/<rank> (DETAIL's signatures), and the flight record's keys
// (diagnostics/group_diagnostics.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "diagnostics/group_diagnostics.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/process_group/process_group.h"
#include "loom/store/store.h"

namespace loom::pg_failure {

inline std::string failureKey(int rank) {
  return "failure/" + std::to_string(rank);
}

inline std::string signatureKey(uint64_t seq, int rank) {
  return "sig/" + std::to_string(seq) + "/" + std::to_string(rank);
}

// The failure-report exchange through the store. It runs on its own detached thread, which
// owns copies of everything it touches, so that a store that does not answer (its host is
// stopped, the network is cut) never holds the worker past its window: the worker waits on
// `published` and `done` with deadlines and goes on without the reports when they pass. The
// thread itself ends when the store's own deadline passes.
// With the flight recorder on, the exchange also carries the rings (group_diagnostics.h): this
// rank's is published right after its report, the first failing rank asks the others for theirs,
// and after the window's wait for every ring the group's one explanation is read back.
struct FailureExchange {
  std::mutex mu;
  std::condition_variable changed;
  bool published = false;
  bool done = false;
  std::vector<int> silent;  // ranks with no report within the window
  std::string reports;      // "\n  rank 1 reported: ..." lines
  bool anyTimeout = false;  // some rank's failure was a timeout
  bool anyInvalid = false;  // some rank found arguments that disagree with a peer's
  std::string storeError;   // the store failed while reading the reports
  std::string explanation;  // the flight records' analysis (empty: recorder off)
  std::string storeGone;    // the first store call that failed with IoError (not a timeout):
                            // the store's server closed the connection or is unreachable

  // Notes `e` when it says the store is gone (an IoError that is not a timeout).
  static void noteStoreGone(std::string& gone, const std::exception& e) {
    if (gone.empty() && dynamic_cast<const IoError*>(&e) != nullptr &&
        dynamic_cast<const TimeoutError*>(&e) == nullptr) {
      gone = e.what();
    }
  }

  // Publishes `ring` (this rank's flight record, JSON; empty when off) and `report` under
  // this rank's keys, then (when `collect`) waits up to `window` for the other ranks' rings and
  // reports and reads them.
  static void run(std::shared_ptr<FailureExchange> self, std::shared_ptr<Store> store, int rank,
                  int size, std::string report, std::string ring, milliseconds window,
                  bool collect) {
    const auto began = Clock::now();
    std::string storeGone;
    try {
      store->set(failureKey(rank), report);
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("rank ", rank, ": could not publish the failure report: ", e.what());
      noteStoreGone(storeGone, e);
    }
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->published = true;
    }
    self->changed.notify_all();
    // After the report, so that the worker closes its connections (the cascade) without
    // waiting for the ring and, on the first failing rank, one request per rank.
    if (!ring.empty() && storeGone.empty()) {
      try {
        diag::publishFailureRecord(*store, rank, size, ring);
      } catch (const std::exception& e) {
        LOOM_LOG_WARNING("rank ", rank, ": could not publish the flight record: ", e.what());
        noteStoreGone(storeGone, e);
      }
    }
    if (!collect) return;

    std::vector<int> silent;
    std::string reports;
    bool anyTimeout = false;
    bool anyInvalid = false;
    std::string storeError;
    std::string explanation;
    if (!ring.empty() && storeGone.empty()) {
      try {
        explanation = diag::explainFailure(*store, rank, size, began + window);
      } catch (const std::exception& e) {
        explanation = std::string("(no analysis: ") + e.what() + ")";
        noteStoreGone(storeGone, e);
      }
    }
    // A store that is gone fails every call at once: nothing more to read.
    if (!storeGone.empty()) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->storeGone = std::move(storeGone);
      self->done = true;
      self->changed.notify_all();
      return;
    }
    try {
      // Every other rank's report, within what the rings' wait above left of the window; a
      // rank whose process is known gone is not waited for.
      std::vector<std::string> keys(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) {
        if (r != rank) keys[static_cast<size_t>(r)] = failureKey(r);
      }
      diag::waitForRanks(*store, keys, began + window);
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        if (!store->check({failureKey(r)})) {
          silent.push_back(r);
          continue;
        }
        const std::string got = store->getString(failureKey(r));
        const size_t nl = got.find('\n');
        if (got.substr(0, nl) == "timeout") anyTimeout = true;
        if (got.substr(0, nl) == "invalid") anyInvalid = true;
        reports += "\n  rank " + std::to_string(r) +
                   " reported: " + (nl == std::string::npos ? got : got.substr(nl + 1));
      }
    } catch (const std::exception& e) {
      storeError = e.what();
      noteStoreGone(storeGone, e);
    }
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->silent = std::move(silent);
      self->reports = std::move(reports);
      self->anyTimeout = anyTimeout;
      self->anyInvalid = anyInvalid;
      self->storeError = std::move(storeError);
      self->explanation = std::move(explanation);
      self->storeGone = std::move(storeGone);
      self->done = true;
    }
    self->changed.notify_all();
  }

  // Starts run() on a detached thread; returns null when no thread could be started.
  static std::shared_ptr<FailureExchange> start(std::shared_ptr<Store> store, int rank, int size,
                                                std::string report, std::string ring,
                                                milliseconds window, bool collect) {
    auto self = std::make_shared<FailureExchange>();
    try {
      std::thread(run, self, std::move(store), rank, size, std::move(report), std::move(ring),
                  window, collect)
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

// Extra time the store gets beyond the report window before the worker gives up on it: at
// most half the window, so that window + slack <= 0.75 x the timeout and a failure is raised
// within 1.75 x the timeout.
inline constexpr milliseconds kStoreSlack{500};
inline milliseconds storeSlack(milliseconds window) {
  return std::min(kStoreSlack, window / 2);
}

// "1, 3, 4".
std::string joinRanks(const std::vector<int>& ranks);

// LOOM_DEBUG=DETAIL, before a collective: publishes this rank's signature of `op` under
// sig/<seq>/<rank>, waits for every rank's (at most op.timeout: TimeoutError naming the ranks
// that did not reach it) and compares them (compareSignatures). `lastSignatureSeq` is the seq
// of this rank's previous check (its key is deleted once every rank wrote the next one).
void checkSignatureInStore(const ProcessGroup& pg, const OpDesc& op, uint64_t& lastSignatureSeq);
// Throws InvalidArgumentError when `signatures` (rank r's at r) differ: this rank's and each
// distinct signature with the ranks that called it.
void compareSignatures(const ProcessGroup& pg, const OpDesc& op,
                       const std::vector<std::string>& signatures);

// An operation's error, classified for the report and the final exception's type.
struct FailureCause {
  std::string what = "unknown exception";
  bool timedOut = false;  // TimeoutError
  bool invalid = false;   // InvalidArgumentError: the ranks' arguments disagree
};
FailureCause classify(std::exception_ptr error);
// This rank's message: `what`, prefixed with who() and the operation unless it names them.
std::string ownMessage(const ProcessGroup& pg, const OpDesc& op, const std::string& what);

// The exchange's outcome: `own` followed by the diagnosis, the silent ranks and every other
// rank's report; the exception's type is the root cause's on every rank (invalid, then
// timeout, then io).
struct FailureOutcome {
  std::string message;
  bool anyTimeout = false;
  bool anyInvalid = false;
  std::exception_ptr error() const;
};
// Publishes this rank's report and `ring` (its flight record, JSON; empty when the recorder is
// off), calls `afterPublish` (the comm backend closes its connections there so that the peers
// blocked on this rank fail now; may be empty), then collects the other ranks' reports and the
// analysis within the window (min(options.failureReportWindow, op.timeout / 2)) and the
// store's slack. Never waits longer than that, whatever the store does.
FailureOutcome exchangeReports(const ProcessGroup& pg, const OpDesc& op, const FailureCause& cause,
                               const std::string& own, const std::string& ring,
                               const std::function<void()>& afterPublish);

}  // namespace loom::pg_failure
