// ProcessGroupMpi's declaration, shared by mpi_backend.cc (the group, its worker, subgroups)
// and mpi_start.cc (each operation mapped onto MPI's non-blocking calls). Private; the contract
// is in mpi_backend.h.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/process_group/process_group.h"

namespace loom {

class ProcessGroupMpi final : public ProcessGroup {
 public:
  // Takes ownership of `comm` (a communicator of exactly this group's ranks, in order).
  // `sharedStore`: whether `store` is shared by the ranks (false: a private HashStore).
  ProcessGroupMpi(std::shared_ptr<Store> store, bool sharedStore, int rank, int size,
                  const ProcessGroupOptions& options, MPI_Comm comm);
  ~ProcessGroupMpi() override;

  void abort(const std::string& reason) override;
  bool isBroken() const override;
  std::string transportSummary() const override;

  bool sharedStore() const override { return sharedStore_; }
  // The communicator newGroup splits (its collectives run on the issuing thread, never on the
  // worker's communicator).
  MPI_Comm controlComm() const { return control_; }

  // One operation in flight: its MPI requests and what completes it.
  struct Running {
    OpDesc op;
    std::shared_ptr<Work> work;
    Deadline deadline{milliseconds(0)};
    std::vector<MPI_Request> requests;
    // Input copied aside or output staged (see mpi_backend.h); kept until MPI is done with it.
    std::vector<uint8_t> staging;
    // float16 / bfloat16 AVG's input divided by the size (mpi_start.cc prescaled()).
    std::vector<uint8_t> prescaled;
    // Counts and displacements of the v-collectives: MPI reads them until completion.
    std::vector<std::vector<int>> arrays;
    // Runs once every request completed: the division of avg, copying staged output.
    std::function<void()> finish;
    bool pointToPoint = false;
  };

 protected:
  std::shared_ptr<Work> post(OpDesc&& op) override;
  void checkDevice(const BufferView& buf, const char* opName) const override;
  void checkOp(const OpDesc& op) const override;

 private:
  struct Item {
    OpDesc op;
    std::shared_ptr<Work> work;
  };

  void workerLoop();
  // Posts `r.op` on MPI (mpi_start.cc). Completes it at once when nothing is to be posted
  // (count 0, monitoredBarrier). Throws on an MPI error.
  void start(Running& r);
  // Tests r's requests; true once all completed (and r finished). Throws on an MPI error or a
  // receive of the wrong size.
  bool test(Running& r);
  // Fails `running` (and empties it) with the group's cause: receives are cancelled,
  // collectives left to MPI (abandoned_).
  void failRunning(std::vector<std::unique_ptr<Running>>& running);
  // Fails r with the exception being handled (its message `what`) and breaks the group. With a
  // shared store, the failure reports and flight records are exchanged first (pg_failure.h),
  // and r's error and the group's cause carry the diagnosis and the other ranks' reports.
  void failOne(Running& r, const std::string& what);
  // LOOM_DEBUG=DETAIL before a collective: every rank's signature of `op` through the shared
  // store (naming the ranks that never reach it), or without one through an MPI all-gather on
  // the group's communicator (a timeout then cannot name them). InvalidArgumentError listing
  // the signatures when they differ.
  void checkSignature(const OpDesc& op);
  std::string timeoutMessage(const Running& r) const;
  // Marks the group broken with `cause` (first call wins); returns the cause in effect.
  std::string markBroken(const std::string& cause);
  std::string brokenCause() const;
  // The message for an operation that is not run because the group failed before.
  std::exception_ptr notRun(const OpDesc& op) const;

  const bool sharedStore_;
  MPI_Comm comm_ = MPI_COMM_NULL;     // the operations' communicator (worker thread)
  MPI_Comm control_ = MPI_COMM_NULL;  // newGroup's (issuing thread)
  std::string summary_;

  mutable std::mutex mu_;  // guards queue_, stopping_, cause_, workerSleeps_
  std::condition_variable wake_;
  std::deque<Item> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for the worker's look before it sleeps
  bool workerSleeps_ = false;      // the worker waits on wake_: post() must notify
  bool stopping_ = false;
  std::string cause_;
  std::atomic<bool> broken_{false};
  // Operations that failed while MPI still held their requests (worker only).
  std::vector<std::unique_ptr<Running>> abandoned_;
  uint64_t lastSignatureSeq_ = 0;  // DETAIL's previous check through the store (worker only)

  std::thread worker_;
};

namespace mpi_detail {

// Polls MPI_Test on `request` until it completes or `deadline` passes (then TimeoutError
// "<who>: <what> did not complete within ... ms"), yielding between tests.
void waitRequest(MPI_Request& request, const Deadline& deadline, const std::string& who,
                 const std::string& what);

}  // namespace mpi_detail

}  // namespace loom
