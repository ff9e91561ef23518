#include "loom/ddp/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <vector>

#include "loom/autograd/serialize.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/socket.h"
#include "loom/ddp/distributed_data_parallel.h"
#include "loom/ddp/tensor_view.h"
#include "loom/ddp/zero_optimizer.h"

namespace loom::ddp {

namespace {

void fsyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    LOOM_THROW(IoError, "checkpoint: cannot open ", path, " to fsync: ", detail::errnoText(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) LOOM_THROW(IoError, "checkpoint: fsync ", path, ": ", detail::errnoText(err));
}

// The scheduler's state: its epoch (int64) and base lr (float64), as "sched.*".
ag::nn::NamedTensors schedulerState(const ag::optim::LRScheduler* scheduler) {
  if (scheduler == nullptr) return {};
  return {{"epoch", ag::scalarTensor(static_cast<double>(scheduler->epoch()), ag::DType::kInt64)},
          {"base_lr", ag::scalarTensor(scheduler->baseLr(), ag::DType::kFloat64)}};
}

// The temporary file of a write of `path` by this process: path.tmp-<host>-<pid> (the host
// because a checkpoint directory may be shared by hosts, and a pid means something on its own).
std::string tempPathOf(const std::string& path) {
  return path + ".tmp-" + net::hostname() + "-" + std::to_string(::getpid());
}

// A writer killed mid-write (SIGKILL, the OOM killer) leaves its temporary file, full-size. The
// next write of `path` removes those of writers on this host that are gone (their pid is not a
// live process); a live writer's (another job writing the same path) and other hosts' are left.
void sweepDeadWritersTemps(const std::string& path, const std::string& dir) {
  const std::string prefix =
      std::filesystem::path(path).filename().string() + ".tmp-" + net::hostname() + "-";
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return;  // the write itself will say what is wrong with the directory
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string digits = name.substr(prefix.size());
    if (digits.size() > 4 && digits.compare(digits.size() - 4, 4, ".tmp") == 0) {
      digits.resize(digits.size() - 4);  // saveSafetensors' own temporary file
    }
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code removeError;
    if (std::filesystem::remove(entry.path(), removeError)) {
      LOOM_LOG_WARNING("checkpoint: removed ", entry.path().string(), ", left by pid ", pid,
                       " on this host, which died while writing ", path);
    }
  }
}

void writeFile(const std::string& path, const ag::nn::Module& model, int64_t step,
               const ag::nn::NamedTensors& extra,
               const ag::optim::LRScheduler* scheduler = nullptr) {
  ag::nn::NamedTensors tensors;
  for (const auto& [name, t] : model.stateDict()) tensors.emplace_back("model." + name, t);
  for (const auto& [name, t] : extra) tensors.emplace_back("optim." + name, t);
  for (const auto& [name, t] : schedulerState(scheduler)) tensors.emplace_back("sched." + name, t);
  const std::filesystem::path target(path);
  const std::string dir =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  sweepDeadWritersTemps(path, dir);
  const std::string tmp = tempPathOf(path);
  // A failure removes the temporary files (saveSafetensors writes tmp + ".tmp" first), so a job
  // that keeps failing to save (a full disk) does not pile up full-size copies.
  try {
    try {
      ag::saveSafetensors(tmp, tensors, {{"step", std::to_string(step)}, {"format", "loom-ddp-1"}});
    } catch (const std::exception& e) {
      LOOM_THROW(IoError, "checkpoint: writing ", tmp, " failed: ", e.what());
    }
    fsyncPath(tmp, false);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      LOOM_THROW(IoError, "checkpoint: rename ", tmp, " -> ", path, ": ", detail::errnoText(errno));
    }
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    std::filesystem::remove(tmp + ".tmp", ignored);
    throw;
  }
  fsyncPath(dir, true);
}

// Rank 0's error text, sent after a failed outcome (length, then at most kMaxSharedError bytes)
// so that every rank's exception says why, even when rank 0 is gone before anyone reads its log.
// Collective: every rank calls it; returns the text as sent (rank 0's, cut at the bound).
constexpr size_t kMaxSharedError = 4096;

std::string shareRankZeroError(ProcessGroup& pg, const std::string& rankZeroError) {
  std::string error = pg.rank() == 0 ? rankZeroError : std::string();
  if (error.size() > kMaxSharedError) {
    error.resize(kMaxSharedError - 3);
    error += "...";
  }
  int64_t length = static_cast<int64_t>(error.size());
  pg.broadcast(view(&length, 1))->wait();
  LOOM_CHECK(length >= 0 && static_cast<size_t>(length) <= kMaxSharedError, pg.who(),
             ": rank 0 sent an error text of ", length, " bytes");
  error.resize(static_cast<size_t>(length));
  if (length > 0) {
    pg.broadcast(view(reinterpret_cast<uint8_t*>(error.data()), error.size()))->wait();
  }
  return error;
}

// Optimizer entries as text, one per line: name, dtype code, dims (tab-separated); what rank 0
// sends so that the other ranks can allocate the tensors before their values arrive.
std::string describe(const ag::nn::NamedTensors& tensors) {
  std::string out;
  for (const auto& [name, t] : tensors) {
    out += name + "\t" + std::to_string(static_cast<int>(t.dtype()));
    for (int64_t d : t.shape()) out += "\t" + std::to_string(d);
    out += "\n";
  }
  return out;
}

ag::nn::NamedTensors allocate(const std::string& description) {
  ag::nn::NamedTensors out;
  size_t pos = 0;
  while (pos < description.size()) {
    const size_t end = description.find('\n', pos);
    LOOM_CHECK(end != std::string::npos, "checkpoint: malformed optimizer description");
    std::vector<std::string> fields;
    size_t f = pos;
    while (true) {
      const size_t tab = description.find('\t', f);
      if (tab == std::string::npos || tab > end) {
        fields.push_back(description.substr(f, end - f));
        break;
      }
      fields.push_back(description.substr(f, tab - f));
      f = tab + 1;
    }
    LOOM_CHECK(fields.size() >= 2, "checkpoint: malformed optimizer description");
    ag::Shape shape;
    for (size_t k = 2; k < fields.size(); ++k) shape.push_back(std::stoll(fields[k]));
    out.emplace_back(fields[0], ag::zeros(shape, static_cast<ag::DType>(std::stoi(fields[1]))));
    pos = end + 1;
  }
  return out;
}

// The saves share this: rank 0 writes, and its outcome travels with a broadcast.
template <class Write>
void saveCollective(ProcessGroup& pg, const std::string& path, Write&& write) {
  // Rank 0's outcome travels with the barrier-like broadcast, so that every rank fails
  // together when the write fails instead of the others waiting for a file that never comes.
  int32_t ok = 1;
  std::string error;
  if (pg.rank() == 0) {
    try {
      write();
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  if (pg.size() > 1) {
    pg.broadcast(view(&ok, 1))->wait();
    if (!ok) {
      std::string sent = shareRankZeroError(pg, error);
      if (pg.rank() != 0) error = std::move(sent);
    }
  }
  if (!ok) {
    if (pg.rank() == 0) throw IoError(error);
    LOOM_THROW(IoError, pg.who(), ": rank 0 failed to write the checkpoint ", path, ": ", error);
  }
}

// The scheduler has no setter for its epoch: it is stepped forward to the saved epoch, which
// sets the optimizer's lr to lrAt(epoch), the value the optimizer state already holds.
void restoreScheduler(ProcessGroup& pg, const std::string& path, ag::optim::LRScheduler& scheduler,
                      int64_t epoch, double baseLr) {
  LOOM_CHECK(scheduler.baseLr() == baseLr, pg.who(), ": checkpoint ", path,
             ": the scheduler was saved with base lr ", baseLr, " but this one has ",
             scheduler.baseLr(), "; construct it from an optimizer with the original lr");
  LOOM_CHECK(scheduler.epoch() <= epoch, pg.who(), ": checkpoint ", path,
             ": the scheduler is already at epoch ", scheduler.epoch(), ", past the saved epoch ",
             epoch, "; load into a freshly constructed scheduler");
  while (scheduler.epoch() < epoch) scheduler.step();
}

// Both loads: `extra` tensors are loaded in place; `optimizer`, when given, gets its state.
Checkpoint loadImpl(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                    ag::nn::NamedTensors extra, ag::optim::Optimizer* optimizer,
                    bool broadcastFromRank0, ag::optim::LRScheduler* scheduler = nullptr) {
  const bool reads = !broadcastFromRank0 || pg.rank() == 0;
  int64_t step = 0;
  int64_t schedEpoch = -1;
  double schedBaseLr = 0;
  int32_t ok = 1;
  std::string error;
  if (reads) {
    try {
      LOOM_CHECK(std::filesystem::exists(path), "checkpoint ", path, " does not exist");
      std::map<std::string, std::string> meta;
      ag::nn::NamedTensors loaded = ag::loadSafetensors(path, &meta);
      ag::nn::NamedTensors modelState, optimState;
      for (auto& [name, t] : loaded) {
        if (name.rfind("model.", 0) == 0) {
          modelState.emplace_back(name.substr(6), t);
        } else if (name.rfind("optim.", 0) == 0) {
          optimState.emplace_back(name.substr(6), t);
        } else if (name == "sched.epoch") {
          schedEpoch = static_cast<int64_t>(t.item());
        } else if (name == "sched.base_lr") {
          schedBaseLr = t.item();
        }
      }
      LOOM_CHECK(scheduler == nullptr || schedEpoch >= 0, "checkpoint ", path,
                 " has no learning-rate scheduler state ('sched.epoch'); it was saved without "
                 "a scheduler");
      if (optimizer != nullptr) {
        try {
          optimizer->loadStateDict(optimState);
        } catch (const std::invalid_argument& e) {
          LOOM_THROW(InvalidArgumentError, "checkpoint ", path,
                     ": optimizer state (entries 'optim.*'): ", e.what());
        }
      }
      model.loadStateDict(modelState);
      for (auto& [name, t] : extra) {
        bool found = false;
        for (auto& [n2, t2] : optimState) {
          if (n2 != name) continue;
          LOOM_CHECK(t2.shape() == t.shape() && t2.dtype() == t.dtype(), "checkpoint ", path,
                     ": 'optim.", name, "' is ", ag::shapeToString(t2.shape()), " ",
                     ag::dtypeName(t2.dtype()), ", expected ", ag::shapeToString(t.shape()), " ",
                     ag::dtypeName(t.dtype()));
          t.copyFrom(t2);
          found = true;
        }
        LOOM_CHECK(found, "checkpoint ", path, " has no tensor 'optim.", name, "'");
      }
      auto it = meta.find("step");
      LOOM_CHECK(it != meta.end(), "checkpoint ", path, " has no 'step' in its metadata");
      step = std::stoll(it->second);
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  if (broadcastFromRank0 && pg.size() > 1) {
    pg.broadcast(view(&ok, 1))->wait();
    if (!ok) {
      std::string sent = shareRankZeroError(pg, error);
      if (!reads) error = std::move(sent);
    }
    if (ok) {
      pg.broadcast(view(&step, 1))->wait();
      if (scheduler != nullptr) {
        pg.broadcast(view(&schedEpoch, 1))->wait();
        pg.broadcast(view(&schedBaseLr, 1))->wait();
      }
      ag::nn::NamedTensors all = model.stateDict();
      for (auto& e : extra) all.push_back(e);
      broadcastTensors(pg, all, 0);
      if (optimizer != nullptr) {
        ag::nn::NamedTensors state;
        std::string description;
        if (pg.rank() == 0) {
          state = optimizer->stateDict();
          description = describe(state);
        }
        int64_t length = static_cast<int64_t>(description.size());
        pg.broadcast(view(&length, 1))->wait();
        description.resize(static_cast<size_t>(length));
        if (length > 0) {
          pg.broadcast(view(reinterpret_cast<uint8_t*>(description.data()), description.size()))
              ->wait();
        }
        if (pg.rank() != 0) state = allocate(description);
        broadcastTensors(pg, state, 0);
        if (pg.rank() != 0) {
          try {
            optimizer->loadStateDict(state);
          } catch (const std::invalid_argument& e) {
            LOOM_THROW(InvalidArgumentError, pg.who(), ": checkpoint ", path,
                       ": rank 0's optimizer state does not fit this rank's optimizer: ", e.what());
          }
        }
      }
    }
  }
  if (!ok) {
    if (reads) throw InvalidArgumentError(pg.who() + ": loading checkpoint: " + error);
    LOOM_THROW(InvalidArgumentError, pg.who(), ": rank 0 failed to load checkpoint ", path, ": ",
               error);
  }
  if (scheduler != nullptr) restoreScheduler(pg, path, *scheduler, schedEpoch, schedBaseLr);
  return Checkpoint{step};
}

}  // namespace

void writeCheckpointFile(const std::string& path, const ag::nn::Module& model, int64_t step,
                         const ag::nn::NamedTensors& extra) {
  writeFile(path, model, step, extra);
}

void writeCheckpointFile(const std::string& path, const ag::nn::Module& model, int64_t step,
                         const ag::optim::Optimizer& optimizer) {
  writeFile(path, model, step, optimizer.stateDict());
}

void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::nn::NamedTensors& extra) {
  saveCollective(pg, path, [&] { writeFile(path, model, step, extra); });
}

void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::optim::Optimizer& optimizer) {
  saveCollective(pg, path, [&] { writeFile(path, model, step, optimizer.stateDict()); });
}

Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::nn::NamedTensors extra, bool broadcastFromRank0) {
  return loadImpl(pg, path, model, std::move(extra), nullptr, broadcastFromRank0);
}

Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::optim::Optimizer& optimizer, bool broadcastFromRank0) {
  return loadImpl(pg, path, model, {}, &optimizer, broadcastFromRank0);
}

void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, const ag::optim::Optimizer& optimizer,
                    const ag::optim::LRScheduler& scheduler) {
  saveCollective(pg, path,
                 [&] { writeFile(path, model, step, optimizer.stateDict(), &scheduler); });
}

Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ag::optim::Optimizer& optimizer, ag::optim::LRScheduler& scheduler,
                          bool broadcastFromRank0) {
  return loadImpl(pg, path, model, {}, &optimizer, broadcastFromRank0, &scheduler);
}

void saveCheckpoint(ProcessGroup& pg, const std::string& path, const ag::nn::Module& model,
                    int64_t step, ZeroRedundancyOptimizer& optimizer,
                    const ag::optim::LRScheduler* scheduler) {
  const ag::nn::NamedTensors state = optimizer.consolidatedStateDict();
  saveCollective(pg, path, [&] { writeFile(path, model, step, state, scheduler); });
}

Checkpoint loadCheckpoint(ProcessGroup& pg, const std::string& path, ag::nn::Module& model,
                          ZeroRedundancyOptimizer& optimizer, ag::optim::LRScheduler* scheduler) {
  // The model (and scheduler) as usual, every rank reading; then the optimizer entries.
  const Checkpoint c = loadImpl(pg, path, model, {}, nullptr, false, scheduler);
  ag::nn::NamedTensors optimState;
  for (auto& [name, t] : ag::loadSafetensors(path)) {
    if (name.rfind("optim.", 0) == 0) optimState.emplace_back(name.substr(6), t);
  }
  try {
    optimizer.loadConsolidatedStateDict(optimState);
  } catch (const std::exception& e) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": checkpoint ", path, ": ", e.what());
  }
  return c;
}

}  // namespace loom::ddp
