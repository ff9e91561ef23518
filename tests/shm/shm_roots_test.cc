// Rooted collectives on the arena whose ranks pass different roots (thread ranks): broadcast,
// scatter and gather fail on every rank with an InvalidArgumentError that names two of the
// roots passed, for every way of claiming roots tried (every rank its own root, roots that form
// a cycle with no rank believing it is the root, two disjoint root groups as [0, 0, 2, 2]), on
// every path (staged in the box, in the slots, over several chunks, a count of 0; broadcast also
// over cross-memory attach and zero-copy windows). Matched roots still give the right data,
// also in a long mix of rooted and unrooted collectives that reuses the arena's per-step
// announcements (Arena::announceCall) many times over.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "shm/arena.h"
#include "shm/shm.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

enum class Rooted { kBroadcast, kScatter, kGather };
enum class Path { kStaged, kCrossMemory, kWindow };

const char* name(Rooted op) {
  switch (op) {
    case Rooted::kBroadcast:
      return "broadcast";
    case Rooted::kScatter:
      return "scatter";
    case Rooted::kGather:
      return "gather";
  }
  return "?";
}

const char* name(Path path) {
  switch (path) {
    case Path::kStaged:
      return "staged";
    case Path::kCrossMemory:
      return "cross-memory";
    case Path::kWindow:
      return "window";
  }
  return "?";
}

// Element i of rank r's input.
int32_t value(int rank, size_t i) {
  return static_cast<int32_t>((rank + 1) * 1000000 + static_cast<int64_t>(i % 999983));
}

ContextOptions contextOptions(Path path) {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 30s;
  o.shmWindowMinBytes = 1;
  o.shmSingleCopy = path == Path::kCrossMemory ? ShmSingleCopy::kOn : ShmSingleCopy::kOff;
  return o;
}

// Runs one `op` of `count` int32 per rank over roots.size() thread ranks, rank r passing
// roots[r], on `path`. Returns per rank "" when the call returned (and checks the data when
// every rank passed the same root), "invalid: <what>" for an InvalidArgumentError, or
// "other: <what>" for any other error.
std::vector<std::string> runRooted(Rooted op, Path path, const std::vector<int>& roots,
                                   size_t count) {
  const int size = static_cast<int>(roots.size());
  bool matched = true;
  for (int root : roots) matched = matched && root == roots[0];
  HashStore store;
  std::vector<std::string> outcome(static_cast<size_t>(size));
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, contextOptions(path));
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena between thread ranks");
    if (path == Path::kWindow) LOOM_CHECK(arena->windows(), arena->windowsFailure());
    if (path == Path::kCrossMemory) LOOM_CHECK(arena->singleCopy(), arena->singleCopyFailure());
    const int root = roots[rank];
    // in: count * size elements (scatter's input), out: count * size (gather's output).
    const size_t total = count * static_cast<size_t>(size);
    const size_t bytes = std::max<size_t>(1, 2 * total) * sizeof(int32_t);
    std::shared_ptr<Window> window;
    std::vector<int32_t> plain;
    int32_t* in;
    if (path == Path::kWindow) {
      window = Window::allocate(bytes);
      in = static_cast<int32_t*>(window->data());
    } else {
      plain.resize(bytes / sizeof(int32_t));
      in = plain.data();
    }
    int32_t* out = in + total;
    for (size_t i = 0; i < total; ++i) in[i] = value(rank, i);
    for (size_t i = 0; i < total; ++i) out[i] = -1;
    CollectiveOptions opts;
    opts.seq = 11;
    opts.timeout = 5s;  // the old code's hangs (a gather of two "roots") end soon
    try {
      switch (op) {
        case Rooted::kBroadcast:
          broadcast(*ctx, in, count, DType::kInt32, root, opts);
          break;
        case Rooted::kScatter:
          scatter(*ctx, in, out, count, DType::kInt32, root, opts);
          break;
        case Rooted::kGather:
          gather(*ctx, in, out, count, DType::kInt32, root, opts);
          break;
      }
    } catch (const InvalidArgumentError& e) {
      outcome[rank] = std::string("invalid: ") + e.what();
      return;
    } catch (const std::exception& e) {
      outcome[rank] = std::string("other: ") + e.what();
      return;
    }
    if (!matched) return;
    for (size_t i = 0; i < count; ++i) {
      switch (op) {
        case Rooted::kBroadcast:
          ASSERT_EQ(in[i], value(root, i)) << "rank " << rank << " at " << i;
          break;
        case Rooted::kScatter:
          ASSERT_EQ(out[i], value(root, rank * count + i)) << "rank " << rank << " at " << i;
          break;
        case Rooted::kGather:
          if (rank != root) break;
          for (int q = 0; q < size; ++q) {
            ASSERT_EQ(out[q * count + i], value(q, i)) << "from rank " << q << " at " << i;
          }
          break;
      }
    }
  });
  return outcome;
}

// The roots a message names ("root=N").
std::set<int> rootsNamed(const std::string& message) {
  std::set<int> named;
  static const std::regex pattern("root=([0-9]+)");
  for (auto it = std::sregex_iterator(message.begin(), message.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    named.insert(std::stoi((*it)[1]));
  }
  return named;
}

std::string describe(const std::vector<int>& roots) {
  std::string s = "[";
  for (size_t i = 0; i < roots.size(); ++i) s += (i ? "," : "") + std::to_string(roots[i]);
  return s + "]";
}

// Every rank failed with an InvalidArgumentError naming two different roots, both passed.
void expectMismatchOnEveryRank(Rooted op, Path path, const std::vector<int>& roots, size_t count) {
  const std::set<int> passed(roots.begin(), roots.end());
  const auto outcome = runRooted(op, path, roots, count);
  for (size_t r = 0; r < roots.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << name(op) << " " << name(path) << " count " << count
                                      << " roots " << describe(roots) << " rank " << r);
    ASSERT_EQ(outcome[r].rfind("invalid: ", 0), 0u) << "returned or other error: " << outcome[r];
    EXPECT_NE(outcome[r].find(std::string(name(op)) + "#11"), std::string::npos) << outcome[r];
    const std::set<int> named = rootsNamed(outcome[r]);
    EXPECT_GE(named.size(), 2u) << outcome[r];
    for (int root : named) EXPECT_TRUE(passed.count(root)) << root << " in " << outcome[r];
  }
}

// Every way of claiming roots tried: each rank its own root; a cycle with no rank believing it
// is the root; one rank disagreeing; two disjoint groups, each with its own root.
const std::vector<std::vector<int>> kMismatched = {{0, 1},       {1, 0},       {0, 1, 1},
                                                   {1, 2, 0},    {2, 2, 0},    {0, 0, 2, 2},
                                                   {1, 1, 3, 3}, {0, 1, 2, 3}, {0, 0, 0, 3}};

// Counts (int32): 0 (a step without data), 8 (in the box), 5000 (one slot chunk) and 150000 (a
// broadcast of 3 chunks, a scatter of several at 2 to 4 ranks).
const size_t kCounts[] = {0, 8, 5000, 150000};

TEST(ShmRoots, MismatchedRootsFailOnEveryRank) {
  for (Rooted op : {Rooted::kBroadcast, Rooted::kScatter, Rooted::kGather}) {
    for (const auto& roots : kMismatched) {
      for (size_t count : kCounts) expectMismatchOnEveryRank(op, Path::kStaged, roots, count);
    }
  }
}

TEST(ShmRoots, MismatchedBroadcastRootsFailOnEveryRankOnTheSingleCopyPaths) {
  for (Path path : {Path::kCrossMemory, Path::kWindow}) {
    for (const auto& roots : kMismatched) {
      for (size_t count : {size_t{8}, size_t{150000}}) {
        expectMismatchOnEveryRank(Rooted::kBroadcast, path, roots, count);
      }
    }
  }
}

TEST(ShmRoots, MatchedRootsGiveTheRightData) {
  for (int size : {2, 3, 4}) {
    for (int root = 0; root < size; ++root) {
      const std::vector<int> roots(static_cast<size_t>(size), root);
      for (size_t count : kCounts) {
        for (Rooted op : {Rooted::kBroadcast, Rooted::kScatter, Rooted::kGather}) {
          const auto outcome = runRooted(op, Path::kStaged, roots, count);
          for (int r = 0; r < size; ++r) {
            EXPECT_EQ(outcome[r], "")
                << name(op) << " count " << count << " roots " << describe(roots) << " rank " << r;
          }
        }
        if (count == 0) continue;
        for (Path path : {Path::kCrossMemory, Path::kWindow}) {
          const auto outcome = runRooted(Rooted::kBroadcast, path, roots, count);
          for (int r = 0; r < size; ++r) {
            EXPECT_EQ(outcome[r], "") << name(path) << " broadcast count " << count << " roots "
                                      << describe(roots) << " rank " << r;
          }
        }
      }
    }
  }
}

// Many rooted collectives in a row, roots changing every call, between unrooted ones and of
// sizes that take one step or several: the per-step announcements are reused over and over
// while ranks run ahead of each other as far as the slots allow.
TEST(ShmRoots, ALongMixOfRootedCollectivesStaysRight) {
  const int size = 4;
  HashStore store;
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, contextOptions(Path::kStaged));
    ASSERT_NE(shm::arenaOf(*ctx), nullptr);
    const size_t counts[] = {0, 1, 8, 700, 70000};
    std::vector<int32_t> in(70000 * size), out(70000 * size);
    CollectiveOptions opts;
    for (int i = 0; i < 300; ++i) {
      const size_t count = counts[i % 5];
      const int root = (i * 7 / 3) % size;
      ++opts.seq;
      switch (i % 4) {
        case 0:
          for (size_t e = 0; e < count; ++e) in[e] = rank == root ? value(root, e + i) : -1;
          broadcast(*ctx, in.data(), count, DType::kInt32, root, opts);
          for (size_t e = 0; e < count; ++e) ASSERT_EQ(in[e], value(root, e + i)) << i;
          break;
        case 1:
          for (size_t e = 0; e < count * size; ++e) in[e] = value(rank, e + i);
          scatter(*ctx, in.data(), out.data(), count, DType::kInt32, root, opts);
          for (size_t e = 0; e < count; ++e) {
            ASSERT_EQ(out[e], value(root, rank * count + e + i)) << i;
          }
          break;
        case 2:
          for (size_t e = 0; e < count; ++e) in[e] = value(rank, e + i);
          gather(*ctx, in.data(), out.data(), count, DType::kInt32, root, opts);
          for (size_t e = 0; rank == root && e < count * size; ++e) {
            ASSERT_EQ(out[e], value(static_cast<int>(e / count), e % count + i)) << i;
          }
          break;
        case 3:
          for (size_t e = 0; e < count; ++e) in[e] = 1;
          allreduce(*ctx, in.data(), in.data(), count, DType::kInt32, ReduceOp::kSum, opts);
          for (size_t e = 0; e < count; ++e) ASSERT_EQ(in[e], size) << i;
          break;
      }
    }
  });
}

// A rooted collective against an unrooted one at the same step still fails as a mismatch
// (the announcement's wait also ends at the peer's post), not as a timeout.
TEST(ShmRoots, ARootedCollectiveAgainstAnUnrootedOneIsAMismatch) {
  for (int size : {2, 3}) {
    HashStore store;
    std::vector<std::string> outcome(static_cast<size_t>(size));
    loom::testing::runThreadRanks(size, [&](int rank) {
      auto ctx = Context::create(store, rank, size, contextOptions(Path::kStaged));
      std::vector<int32_t> buf(16, rank);
      CollectiveOptions opts;
      opts.seq = 5;
      opts.timeout = 5s;
      try {
        if (rank == size - 1) {
          allreduce(*ctx, buf.data(), buf.data(), 8, DType::kInt32, ReduceOp::kSum, opts);
        } else {
          broadcast(*ctx, buf.data(), 8, DType::kInt32, 0, opts);
        }
      } catch (const InvalidArgumentError& e) {
        outcome[rank] = std::string("invalid: ") + e.what();
      } catch (const std::exception& e) {
        outcome[rank] = std::string("other: ") + e.what();
      }
    });
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(outcome[r].rfind("invalid: ", 0), 0u) << "rank " << r << ": " << outcome[r];
    }
  }
}

}  // namespace
}  // namespace loom::comm::testing
