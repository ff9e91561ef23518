#include "shrink.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/shrink.h"
#include "loom/store/store.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

size_t bytesOf(const ag::nn::NamedTensors& tensors) {
  size_t n = 0;
  for (const auto& [name, t] : tensors) n += t.nbytes();
  return n;
}

// dst = a deep copy of src, reusing dst's tensors when the names and sizes match (the model's
// state dict is the same every step, so after the first take this is one memcpy per tensor).
void copyInto(ag::nn::NamedTensors& dst, const ag::nn::NamedTensors& src) {
  bool reuse = dst.size() == src.size();
  for (size_t i = 0; reuse && i < src.size(); ++i) {
    reuse = dst[i].first == src[i].first && dst[i].second.shape() == src[i].second.shape() &&
            dst[i].second.dtype() == src[i].second.dtype();
  }
  if (!reuse) {
    dst.clear();
    for (const auto& [name, t] : src) dst.emplace_back(name, t.clone());
    return;
  }
  for (size_t i = 0; i < src.size(); ++i) {
    std::memcpy(dst[i].second.rawData(), src[i].second.rawData(), src[i].second.nbytes());
  }
}

// The ranks of `group` whose process the failure diagnosis finds gone, with its note ("dead:
// its process 4242 on node7 no longer exists ..."). Only a same-host process check says "dead";
// a rank on another host, or one without heartbeats, is unknown and not listed.
std::vector<std::pair<int, std::string>> deadRanks(ProcessGroup& group) {
  std::vector<std::optional<diag::RankDump>> dumps(group.size());
  dumps[group.rank()] = diag::RankDump{};  // this rank is alive: not looked up
  std::vector<std::pair<int, std::string>> dead;
  if (!group.store()) return dead;
  const std::vector<std::string> notes = diag::absentNotes(*group.store(), dumps);
  for (size_t r = 0; r < notes.size(); ++r) {
    if (notes[r].rfind("dead:", 0) == 0) dead.emplace_back(static_cast<int>(r), notes[r]);
  }
  return dead;
}

}  // namespace

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

size_t StepSnapshot::bytes() const {
  return bytesOf(model) + bytesOf(optimizer) + sizeof(schedulerEpoch);
}

void SnapshotRing::take(int64_t step, const ag::nn::Module& model,
                        const ag::optim::Optimizer& optimizer,
                        const ag::optim::LRScheduler* scheduler) {
  const auto start = Clock::now();
  StepSnapshot& s = slots_[next_];
  s.step = step;
  copyInto(s.model, model.stateDict());
  s.optimizer = optimizer.stateDict();  // already a copy (optim.h)
  s.schedulerEpoch = scheduler ? scheduler->epoch() : 0;
  next_ = 1 - next_;
  ++taken_;
  totalMillis_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

const StepSnapshot* SnapshotRing::before(int64_t step) const {
  for (const StepSnapshot& s : slots_) {
    if (s.step == step) return &s;
  }
  return nullptr;
}

size_t SnapshotRing::bytesPerSnapshot() const {
  const StepSnapshot& latest = slots_[1 - next_];
  return latest.step < 0 ? 0 : latest.bytes();
}

double SnapshotRing::meanMillis() const {
  return taken_ > 0 ? totalMillis_ / static_cast<double>(taken_) : 0.0;
}

ShrinkResult shrinkAfterFailure(ProcessGroup& broken, const std::vector<int>& launchRanks,
                                int64_t finishedSteps, const ShrinkSettings& settings) {
  LOOM_CHECK_EQ(static_cast<int>(launchRanks.size()), broken.size(),
                "shrinkAfterFailure: one launch rank per member of the broken group");
  const auto start = Clock::now();
  ShrinkResult result;
  const std::vector<std::pair<int, std::string>> dead = deadRanks(broken);
  ShrinkOptions options;
  for (const auto& [r, note] : dead) options.excludeRanks.push_back(r);
  options.joinWindow = settings.joinWindow;
  options.minSize = settings.minRanks;
  result.group = shrinkGroup(broken, options);

  // The members, in the old group's numbering (shrinkGroup sets parentRanks to them).
  const std::vector<int>& members = result.group->options().parentRanks;
  for (int m : members) result.launchRanks.push_back(launchRanks[m]);
  for (int r = 0; r < broken.size(); ++r) {
    if (std::find(members.begin(), members.end(), r) != members.end()) continue;
    std::string why = "did not join the survivors within the " +
                      std::to_string(settings.joinWindow.count()) + " ms window";
    for (const auto& [d, note] : dead) {
      if (d == r) why = note;
    }
    result.lost.emplace_back(launchRanks[r], why);
  }

  int64_t resume = finishedSteps;
  result.group->allreduce(view(&resume, 1), {.reduceOp = ReduceOp::kMin})->wait();
  LOOM_CHECK(resume == finishedSteps || resume + 1 == finishedSteps, result.group->who(),
             ": shrink: the survivors agreed on step ", resume, " but this rank finished ",
             finishedSteps, " steps (a survivor can be at most one step ahead of another)");
  result.resumeStep = resume;
  result.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return result;
}

std::vector<KillPoint> parseKills(const std::vector<std::string>& specs) {
  std::vector<KillPoint> out;
  for (const std::string& spec : specs) {
    const auto colon = spec.find(':');
    KillPoint k;
    size_t usedRank = 0, usedStep = 0;
    try {
      if (colon != std::string::npos) {
        k.rank = std::stoi(spec.substr(0, colon), &usedRank);
        k.step = std::stoll(spec.substr(colon + 1), &usedStep);
      }
    } catch (const std::exception&) {
      usedRank = usedStep = 0;
    }
    LOOM_CHECK(colon != std::string::npos && usedRank == colon && usedRank > 0 &&
                   usedStep == spec.size() - colon - 1 && usedStep > 0 && k.rank >= 0 &&
                   k.step >= 1,
               "--test-kill '", spec, "' is not RANK:STEP (a launch rank >= 0 and a step >= 1)");
    out.push_back(k);
  }
  return out;
}

void truncateLog(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;  // no log yet
  std::string kept, line;
  bool first = true;
  while (std::getline(in, line)) {
    const auto comma = line.find(',');
    bool keep = first && line.rfind("step,", 0) == 0;
    if (!keep && comma != std::string::npos) {
      try {
        keep = std::stoll(line.substr(0, comma)) <= step;
      } catch (const std::exception&) {
        keep = false;
      }
    }
    first = false;
    if (keep) kept += line + "\n";
  }
  if (in.bad()) {
    LOOM_THROW(Error, "--log: cannot read ", path, ": ", detail::errnoText(errno),
               "; it is left as it was");
  }
  in.close();
  // The rows are written whole to tmp before it replaces the log: a failed write (a full disk)
  // removes tmp and leaves the log as it was, instead of replacing it with a cut one.
  const std::string tmp = path + ".tmp";
  auto fail = [&](const char* what, int err) {
    std::remove(tmp.c_str());
    LOOM_THROW(Error, "--log: ", what, " ", tmp, " (the rows of ", path, " up to step ", step,
               "): ", detail::errnoText(err), "; ", path, " is left as it was");
  };
  std::ofstream out(tmp, std::ios::trunc);
  if (!out) fail("cannot open", errno);
  out << kept;
  out.flush();
  if (!out) fail("cannot write", errno);
  out.close();
  if (!out) fail("cannot close", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename", errno);
}

}  // namespace loom::train
