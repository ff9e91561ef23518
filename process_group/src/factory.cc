#include "loom/process_group/factory.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm_backend.h"
#include "loom/comm/context.h"
#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"
#include "loom/store/prefix_store.h"
#include "pg_settings.h"

#ifdef LOOM_HAVE_NCCL
#include "nccl/nccl_backend.h"
#endif
#ifdef LOOM_HAVE_MPI
#include "mpi/mpi_backend.h"
#endif

namespace loom {

namespace {

// How long a failed setup in the process that hosts the store keeps it up for the other ranks
// to read why (createProcessGroup).
constexpr std::chrono::milliseconds kSetupFailureLinger{2000};

}  // namespace

std::vector<std::string> backendNames() {
  return {"tcp", "nccl", "verbs", "mpi"};
}

// checkAvailable is the one place that decides; isAvailable only asks it.
bool isAvailable(const std::string& backend) {
  try {
    checkAvailable(backend);
    return true;
  } catch (const NotAvailableError&) {
    return false;
  } catch (const InvalidArgumentError&) {
    return false;
  }
}

void checkAvailable(const std::string& backend) {
  if (backend == "tcp") return;
  if (backend == "nccl") {
#ifdef LOOM_HAVE_NCCL
    if (ncclDeviceCount() == 0) {
      LOOM_THROW(NotAvailableError, "nccl backend: no CUDA device is usable by this process (",
                 ncclNoDeviceReason(), ")");
    }
    return;
#else
    LOOM_THROW(NotAvailableError, "built without NCCL (LOOM_WITH_NCCL=OFF)");
#endif
  }
  if (backend == "verbs") {
    std::string why;
    if (!comm::verbsAvailable(&why)) {
      LOOM_THROW(NotAvailableError, "createProcessGroup(\"verbs\"): ", why);
    }
    return;
  }
  if (backend == "mpi") {
#ifdef LOOM_HAVE_MPI
    return;
#else
    LOOM_THROW(NotAvailableError,
               "built without MPI (LOOM_WITH_MPI=OFF, or Open MPI was not found at configure "
               "time; scripts/setup.sh installs openmpi-bin and libopenmpi-dev)");
#endif
  }
  LOOM_THROW(InvalidArgumentError, "unknown backend \"", backend,
             "\"; expected one of: tcp, nccl, verbs, mpi");
}

// The reproducible mode (docs/reproducible.md) is the tcp backend's (with shared memory within
// a host): NCCL and MPI add in orders their own algorithms choose. A group that asked for it on
// those is refused, rather than reducing without it while the caller trusts its sums to be
// reproducible. A verbs group is not refused, but createVerbsContext does not take
// ContextOptions::reproducible, so it reduces without the mode.
void checkReproducible(const std::string& backend, const ProcessGroupOptions& options) {
  if (backend != "nccl" && backend != "mpi") return;
  const bool fromOptions = options.comm.context.reproducible;
  const bool fromEnvironment = settings::flag("LOOM_REPRODUCIBLE").value_or(false);
  LOOM_CHECK(!fromOptions && !fromEnvironment, "createProcessGroup(\"", backend,
             "\"): reproducible mode was asked for (",
             fromOptions ? "ContextOptions::reproducible" : "LOOM_REPRODUCIBLE=1", "), and the ",
             backend,
             " backend has none: its sums depend on the library's algorithm and order. Use the "
             "tcp backend (shared memory within a host), or turn the mode off for this group");
}

std::shared_ptr<ProcessGroup> createProcessGroup(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 const ProcessGroupOptions& options) {
  // The mpi backend takes its membership from MPI: its store is optional (mpi_backend.h).
  LOOM_CHECK(store != nullptr || backend == "mpi", "createProcessGroup(\"", backend,
             "\"): the store is null");
  LOOM_CHECK(size >= 1, "createProcessGroup(\"", backend,
             "\"): world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "createProcessGroup(\"", backend, "\"): rank ", rank,
             " is out of range for world size ", size, " (expected 0 <= rank < ", size, ")");
  checkReproducible(backend, options);
  checkAvailable(backend);
  const ProcessGroupOptions effective = withEnvironment(options);
  const bool hostsStore = effective.hostsStore.value_or(rank == effective.storeHostRank);
  std::shared_ptr<ProcessGroup> pg;
  try {
    if (backend == "tcp") {
      pg = std::make_shared<ProcessGroupComm>("tcp", std::move(store), rank, size, effective,
                                              &comm::Context::create);
    } else if (backend == "verbs") {
      pg = std::make_shared<ProcessGroupComm>("verbs", std::move(store), rank, size, effective,
                                              &comm::createVerbsContext);
    } else if (backend == "mpi") {
#ifdef LOOM_HAVE_MPI
      pg = createProcessGroupMpi(std::move(store), rank, size, effective);
#endif
    } else {
#ifdef LOOM_HAVE_NCCL
      pg = createProcessGroupNccl(std::move(store), rank, size, effective);
#endif
    }
  } catch (const std::exception&) {
    // The setup failed in the process that hosts the store. The other ranks learn why from the
    // setup-failed key, which they watch at least every half second; if this process's exit
    // (initProcessGroup's store goes as this unwinds) took the store first, they would fail
    // naming a lost store instead. So it stays a moment before it throws.
    if (hostsStore && size > 1 && backend != "mpi") {
      std::this_thread::sleep_for(std::min(kSetupFailureLinger, effective.timeout));
    }
    throw;
  }
  logGroupReady(*pg);
  return pg;
}

std::shared_ptr<ProcessGroup> newGroup(ProcessGroup& parent, const std::vector<int>& ranks) {
  ProcessGroupOptions options = parent.options();
  options.groupName.clear();
  options.parentRanks.clear();
  return newGroup(parent, ranks, options);
}

std::shared_ptr<ProcessGroup> newGroup(ProcessGroup& parent, const std::vector<int>& ranks,
                                       const ProcessGroupOptions& options) {
  LOOM_CHECK(!ranks.empty(), parent.who(), ": newGroup: the rank list is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    parent.checkRoot(sorted[i], "newGroup", "rank");
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      LOOM_THROW(InvalidArgumentError, parent.who(), ": newGroup: rank ", sorted[i],
                 " appears twice in the rank list");
    }
  }
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(parent.issueMu_);
    id = ++parent.nextGroupId_;
  }
#ifdef LOOM_HAVE_MPI
  // Subgroups of an mpi group are MPI communicators split from the parent's, not a store
  // rendezvous; non-members take part in the split.
  if (parent.backendName() == "mpi") return newGroupMpi(parent, sorted, id, options);
#endif
  const auto it = std::find(sorted.begin(), sorted.end(), parent.rank());
  if (it == sorted.end()) return nullptr;

  std::string list;
  for (int r : sorted) list += (list.empty() ? "" : ",") + std::to_string(r);
  const std::string name = "group/" + std::to_string(id);
  auto sub = std::make_shared<PrefixStore>(name, parent.store());
  // Every member checks its list against the lowest member's, so that a rank passing a
  // different list gets a clear error instead of a hang in the connection setup.
  sub->set("members/" + std::to_string(parent.rank()), list);
  const std::string leaderKey = "members/" + std::to_string(sorted.front());
  sub->wait({leaderKey}, options.timeout);
  const std::string leaderList = sub->getString(leaderKey);
  if (leaderList != list) {
    LOOM_THROW(InvalidArgumentError, parent.who(), ": newGroup #", id, ": this rank passed ranks [",
               list, "] but rank ", sorted.front(), " passed [", leaderList,
               "]; every rank must pass the same list");
  }
  ProcessGroupOptions subOptions = options;
  subOptions.parentRanks = sorted;
  if (subOptions.groupName.empty()) {
    const std::string& parentName = parent.options().groupName;
    subOptions.groupName = parentName.empty() ? name : parentName + "/" + name;
  }
  const int subRank = static_cast<int>(it - sorted.begin());
  return createProcessGroup(parent.backendName(), sub, subRank, static_cast<int>(sorted.size()),
                            subOptions);
}

}  // namespace loom
