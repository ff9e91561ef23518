// shrinkGroup (shrink.h). How the agreement works, in the words the code uses:
// - `base` is "shrink/<attempt>/" in the old group's store: one namespace per shrink.
// - Each caller sets `alive/<rank>`, then polls in slices (so that another caller's decision
//   is seen soon) until the decision key `members` exists, or every `expected` rank (all ranks
//   but the excluded ones) is alive, or the join `window` is over.
// - In the last two cases the caller proposes the alive ranks it sees with compareSet(members,
//   "", proposal). compareSet makes the first proposal the decision; every caller reads it
//   back from compareSet's answer or from the key, so all of them act on one member list.
//   A rank that sets alive/<rank> after the decision reads a list without itself: excluded.
#include "loom/process_group/shrink.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/process_group/factory.h"
#include "loom/store/prefix_store.h"
#include "loom/store/store.h"

namespace loom {
namespace {

constexpr std::chrono::milliseconds kSlice{100};

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::vector<int> parseRanks(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

// This process's shrinkGroup calls per group (the group is identified by its control block,
// so a destroyed group's count never passes to a new group at the same address).
int nextAttempt(ProcessGroup& group) {
  static std::mutex mu;
  static std::vector<std::pair<std::weak_ptr<ProcessGroup>, int>> counts;
  std::lock_guard<std::mutex> lock(mu);
  std::erase_if(counts, [](const auto& entry) { return entry.first.expired(); });
  const std::weak_ptr<ProcessGroup> self = group.weak_from_this();
  for (auto& [weak, count] : counts) {
    if (!weak.owner_before(self) && !self.owner_before(weak)) return ++count;
  }
  counts.emplace_back(self, 1);
  return 1;
}

}  // namespace

std::shared_ptr<ProcessGroup> shrinkGroup(ProcessGroup& group, const ShrinkOptions& options) {
  const int me = group.rank();
  std::vector<int> excluded = options.excludeRanks;
  std::sort(excluded.begin(), excluded.end());
  for (int r : excluded) {
    LOOM_CHECK(r >= 0 && r < group.size(), group.who(), ": shrinkGroup: excluded rank ", r,
               " is out of range for a group of ", group.size());
  }
  LOOM_CHECK(!std::binary_search(excluded.begin(), excluded.end(), me), group.who(),
             ": shrinkGroup: this rank is in its own excludeRanks");
  LOOM_CHECK(options.minSize >= 1, group.who(), ": shrinkGroup: minSize must be at least 1, got ",
             options.minSize);
  LOOM_CHECK(options.joinWindow.count() >= 0, group.who(),
             ": shrinkGroup: joinWindow must not be negative");

  const int attempt = group.weak_from_this().expired() ? 1 : nextAttempt(group);
  const std::string base = "shrink/" + std::to_string(attempt) + "/";
  Store& store = *group.store();
  const std::string decisionKey = base + "members";
  auto aliveKey = [&](int r) { return base + "alive/" + std::to_string(r); };

  std::vector<int> expected;
  for (int r = 0; r < group.size(); ++r) {
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) expected.push_back(r);
  }
  std::vector<std::string> expectedKeys;
  for (int r : expected) expectedKeys.push_back(aliveKey(r));

  const Deadline window(options.joinWindow);
  std::string decision;
  if (store.check({decisionKey})) {
    decision = store.getString(decisionKey);  // decided before this rank arrived: late
  } else {
    store.set(aliveKey(me), "1");
    for (;;) {
      if (store.check({decisionKey})) {
        decision = store.getString(decisionKey);
        break;
      }
      const bool everyone = store.check(expectedKeys);
      if (everyone || window.expired()) {
        std::vector<int> alive;
        for (int r : expected) {
          if (everyone || store.check({aliveKey(r)})) alive.push_back(r);
        }
        decision = toString(store.compareSet(decisionKey, {}, toBytes(joinRanks(alive))));
        break;
      }
      try {
        store.wait(expectedKeys, std::min(kSlice, window.remaining()));
      } catch (const TimeoutError&) {
      }
    }
  }

  const std::vector<int> members = parseRanks(decision);
  const auto mine = std::find(members.begin(), members.end(), me);
  if (mine == members.end()) {
    LOOM_THROW(IoError, group.who(), ": shrinkGroup #", attempt,
               ": excluded: the survivors had already agreed on ranks [", decision,
               "] when this rank reported (it arrived after the join window of ",
               options.joinWindow.count(), " ms)");
  }
  if (static_cast<int>(members.size()) < options.minSize) {
    LOOM_THROW(IoError, group.who(), ": shrinkGroup #", attempt, ": only ", members.size(),
               " rank(s) survived (ranks [", decision, "] of ", group.size(),
               "), fewer than minSize ", options.minSize);
  }

  ProcessGroupOptions newOptions = group.options();
  const std::string& oldName = newOptions.groupName;
  newOptions.groupName =
      (oldName.empty() ? std::string("world") : oldName) + "/shrink" + std::to_string(attempt);
  // parentRanks name the members in the old group's numbering (messages map back through it).
  newOptions.parentRanks = members;
  const int newRank = static_cast<int>(mine - members.begin());
  LOOM_LOG_INFO(group.who(), ": shrinkGroup #", attempt, ": survivors [", decision,
                "]; this rank becomes rank ", newRank, " of ", members.size());
  auto newStore = std::make_shared<PrefixStore>(base + "group", group.store());
  return createProcessGroup(group.backendName(), newStore, newRank,
                            static_cast<int>(members.size()), newOptions);
}

}  // namespace loom
