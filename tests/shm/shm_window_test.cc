// Zero-copy windows (loom/comm/window.h): Window's own contract (sizes, the registry's
// boundaries, errors), and across real processes (forked before any thread exists, a directory
// store): every collective of the window path gives the staged path's results for sizes that
// do not divide evenly, buffers in the middle of a window, in place and out of place; the peers
// really map each other's windows (their memfds show in /proc/self/maps); more windows than
// the mapping cache holds stay correct and bounded; ranks that disagree (window buffers on one
// rank, ordinary memory on the other) fail on every rank with an InvalidArgumentError naming
// both paths, within the deadline; one rank with windows off turns them off for all, and
// window buffers then take the staged path with the same results; a peer stopped or killed in the
// middle of a window all-reduce fails the others naming it.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "shm/arena.h"
#include "shm/shm.h"
#include "shm/shm_single_copy.h"
#include "shm/window_registry.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

ContextOptions options() {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 20s;
  return o;
}

// Forks `size` ranks over a directory store; each creates its Context with optionsOf(rank) and
// runs fn(rank, ctx). Returns "" when every rank exited 0, else what failed.
std::string runProcessRanks(int size, const std::function<ContextOptions(int)>& optionsOf,
                            const std::function<void(int, Context* ctx)>& fn,
                            std::chrono::seconds timeout = 60s) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, optionsOf(rank));
    fn(rank, ctx.get());
  });
  return children.waitAllOk(timeout);
}

// The default options with the window path from `minBytes` up (0: the measured defaults).
std::function<ContextOptions(int)> windowsFrom(size_t minBytes) {
  return [minBytes](int) {
    ContextOptions o = options();
    o.shmWindowMinBytes = minBytes;
    return o;
  };
}

// Mappings in this process of other processes' windows: lines of /proc/self/maps naming a
// loom-window memfd that is not one of `own`.
int foreignWindowMappings(const std::vector<std::shared_ptr<Window>>& own) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:loom-window-") == std::string::npos) continue;
    const uint64_t start = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    bool mine = false;
    for (const auto& w : own) mine = mine || reinterpret_cast<uintptr_t>(w->data()) == start;
    n += !mine;
  }
  return n;
}

TEST(Window, AllocatesWholeZeroedPagesAndRegistersTheRange) {
  auto w = Window::allocate(5000);
  ASSERT_EQ(w->size(), 8192u);
  const auto* bytes = static_cast<const uint8_t*>(w->data());
  for (size_t i = 0; i < w->size(); ++i) ASSERT_EQ(bytes[i], 0) << i;
  auto* p = static_cast<uint8_t*>(w->data());
  auto whole = shm::findWindow(p, 8192);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->id, w->id());
  EXPECT_EQ(whole->base, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(whole->bytes, 8192u);
  EXPECT_TRUE(shm::findWindow(p + 100, 8092));
  EXPECT_FALSE(shm::findWindow(p + 100, 8093)) << "runs past the end";
  EXPECT_FALSE(shm::findWindow(p - 1, 2)) << "starts before the window";
  std::vector<char> ordinary(64);
  EXPECT_FALSE(shm::findWindow(ordinary.data(), ordinary.size()));
  auto other = Window::allocate(1);
  EXPECT_NE(other->id(), w->id());
  EXPECT_EQ(other->size(), 4096u);
  const uint64_t id = w->id();
  w.reset();
  auto gone = shm::findWindow(p, 1);
  EXPECT_TRUE(!gone || gone->id != id) << "a freed window is still registered";
}

// How a peer opens a window: through /proc/<pid>/fd after checking the link names the
// window's memfd. A wrong id (a reused descriptor number) and a closed descriptor are refused
// with the path and the reason; the right one maps the owner's bytes.
TEST(Window, PeersMapOnlyTheWindowTheyWereTold) {
  auto w = Window::allocate(4096);
  static_cast<uint64_t*>(w->data())[0] = 0x1234abcd;
  const auto ref = shm::findWindow(w->data(), 8);
  ASSERT_TRUE(ref);
  std::string why;
  uint8_t* local = shm::mapPeerWindow(::getpid(), *ref, why);
  ASSERT_NE(local, nullptr) << why;
  EXPECT_EQ(*reinterpret_cast<const uint64_t*>(local), 0x1234abcdu);
  ::munmap(local, ref->bytes);

  shm::WindowRef wrongId = *ref;
  wrongId.id += 1000;
  EXPECT_EQ(shm::mapPeerWindow(::getpid(), wrongId, why), nullptr);
  EXPECT_NE(why.find("expected the memfd " + shm::windowMemfdName(wrongId.id)), std::string::npos)
      << why;

  shm::WindowRef closed = *ref;
  closed.fd = 1 << 20;  // no such descriptor
  EXPECT_EQ(shm::mapPeerWindow(::getpid(), closed, why), nullptr);
  EXPECT_NE(why.find("/fd/" + std::to_string(closed.fd)), std::string::npos) << why;
}

TEST(Window, ZeroBytesIsAnInvalidArgument) {
  try {
    Window::allocate(0);
    FAIL() << "allocate(0) returned";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("0 bytes"), std::string::npos) << e.what();
  }
}

// Every window collective across processes at 2, 3 and 4 ranks; the window path from 1 byte
// up, so that the small, uneven and odd-sized cases take it too.
TEST(ShmWindowProcesses, EveryCollectiveMatchesAndPeersMapTheWindows) {
  for (int size : {2, 3, 4}) {
    auto body = [&](int rank, Context* ctx) {
      shm::Arena* arena = shm::arenaOf(*ctx);
      LOOM_CHECK(arena != nullptr, "no arena across processes");
      LOOM_CHECK(arena->windows(), "windows off: ", arena->windowsFailure());
      CollectiveOptions opts;
      std::vector<std::shared_ptr<Window>> own;
      for (size_t count : {size_t{1}, size_t{7}, size_t{3001}, size_t{300001}}) {
        // Buffers start 64 bytes into their windows: the offset travels too.
        auto win = Window::allocate(64 + count * 8 * (size + 1));
        own.push_back(win);
        auto* base = static_cast<uint8_t*>(win->data()) + 64;
        // all-reduce in place (float sum, int64 max, double avg) and out of place
        auto* f = reinterpret_cast<float*>(base);
        for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank + 1 + i % 5);
        ++opts.seq;
        allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
        for (size_t i = 0; i < count; ++i) {
          const float want = static_cast<float>(size * (size + 1) / 2 + size * (i % 5));
          LOOM_CHECK_EQ(f[i], want, "float sum at ", i, " of ", count);
        }
        auto* m = reinterpret_cast<int64_t*>(base);
        auto* mo = m + count;
        for (size_t i = 0; i < count; ++i) m[i] = (rank * 7919 + static_cast<int64_t>(i)) % 1000;
        ++opts.seq;
        allreduce(*ctx, m, mo, count, DType::kInt64, ReduceOp::kMax, opts);
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < size; ++q) {
            want = std::max<int64_t>(want, (q * 7919 + static_cast<int64_t>(i)) % 1000);
          }
          LOOM_CHECK_EQ(mo[i], want, "int64 max at ", i);
        }
        auto* d = reinterpret_cast<double*>(base);
        for (size_t i = 0; i < count; ++i) d[i] = rank * 2.0;
        ++opts.seq;
        allreduce(*ctx, d, d, count, DType::kFloat64, ReduceOp::kAvg, opts);
        for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(d[i], static_cast<double>(size - 1));
        // broadcast from the last rank
        auto* b = reinterpret_cast<int32_t*>(base);
        for (size_t i = 0; i < count; ++i) b[i] = rank == size - 1 ? static_cast<int>(i) : -1;
        ++opts.seq;
        broadcast(*ctx, b, count, DType::kInt32, size - 1, opts);
        for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(b[i], static_cast<int>(i));
        // all-gather out of place, then reduce-scatter of the gathered buffer
        auto* in = reinterpret_cast<int32_t*>(base);
        auto* all = in + count;
        for (size_t i = 0; i < count; ++i) in[i] = rank * 100000 + static_cast<int>(i % 1000);
        ++opts.seq;
        allgather(*ctx, in, all, count, DType::kInt32, opts);
        for (size_t i = 0; i < count * size; ++i) {
          LOOM_CHECK_EQ(all[i],
                        static_cast<int>(i / count) * 100000 + static_cast<int>(i % count % 1000),
                        "all-gather at ", i);
        }
        std::vector<int32_t> rs(count, -1);  // output outside a window: peers never read it
        ++opts.seq;
        reduceScatter(*ctx, all, rs.data(), count, DType::kInt32, ReduceOp::kSum, opts);
        for (size_t i = 0; i < count; ++i) {
          LOOM_CHECK_EQ(rs[i], size * (rank * 100000 + static_cast<int>(i % 1000)),
                        "reduce-scatter at ", i);
        }
        // reduce in place to a root that moves with the count (a root >= 2 folds its own
        // operand through the bounce buffer); every rank writes its segment into the root's
        // window, and the other ranks' inputs stay as they were
        const int root = static_cast<int>(count % static_cast<size_t>(size));
        for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank + 1 + i % 5);
        ++opts.seq;
        reduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, root, opts);
        for (size_t i = 0; i < count; ++i) {
          const float want = rank == root
                                 ? static_cast<float>(size * (size + 1) / 2 + size * (i % 5))
                                 : static_cast<float>(rank + 1 + i % 5);
          LOOM_CHECK_EQ(f[i], want, "reduce in place at ", i, " of ", count, " (root ", root, ")");
        }
        // out of place: double avg into the root's window; int64 max into a root output outside
        // any window (the root then folds every input alone)
        auto* davg = reinterpret_cast<double*>(base);
        auto* dout = davg + count;
        for (size_t i = 0; i < count; ++i) davg[i] = rank * 2.0 + static_cast<double>(i % 3);
        ++opts.seq;
        reduce(*ctx, davg, rank == root ? dout : nullptr, count, DType::kFloat64, ReduceOp::kAvg,
               root, opts);
        if (rank == root) {
          for (size_t i = 0; i < count; ++i) {
            LOOM_CHECK_EQ(dout[i], static_cast<double>(size - 1 + i % 3), "reduce avg at ", i);
          }
        }
        for (size_t i = 0; i < count; ++i) m[i] = (rank * 7919 + static_cast<int64_t>(i)) % 1000;
        std::vector<int64_t> plain(rank == root ? count : 0, -1);
        ++opts.seq;
        reduce(*ctx, m, plain.data(), count, DType::kInt64, ReduceOp::kMax, root, opts);
        for (size_t i = 0; i < plain.size(); ++i) {
          int64_t want = 0;
          for (int q = 0; q < size; ++q) {
            want = std::max<int64_t>(want, (q * 7919 + static_cast<int64_t>(i)) % 1000);
          }
          LOOM_CHECK_EQ(plain[i], want, "reduce max into ordinary memory at ", i);
        }
      }
      ++opts.seq;
      barrier(*ctx, opts);
      // Every peer read this rank's windows through its own mapping, so this rank mapped
      // theirs: at least one foreign window per peer.
      const int foreign = foreignWindowMappings(own);
      LOOM_CHECK(foreign >= size - 1, "rank ", rank, " maps ", foreign,
                 " windows of its peers; expected at least ", size - 1);
    };
    EXPECT_EQ(runProcessRanks(size, windowsFrom(1), body, 120s), "") << "world size " << size;
  }
}

// A new window per collective, far more than the mapping cache holds: results stay right
// and each rank keeps at most kPeerMappings mappings per peer.
TEST(ShmWindowProcesses, MoreWindowsThanTheCacheStayCorrectAndBounded) {
  auto body = [&](int rank, Context* ctx) {
    CollectiveOptions opts;
    const size_t count = 64 << 10;
    for (int k = 0; k < 40; ++k) {
      auto win = Window::allocate(count * sizeof(float));
      auto* f = static_cast<float*>(win->data());
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(k + rank);
      ++opts.seq;
      allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
      for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(f[i], static_cast<float>(2 * k + 1));
    }
    const int foreign = foreignWindowMappings({});
    LOOM_CHECK(foreign >= 1 && foreign <= static_cast<int>(shm::Arena::kPeerMappings), "rank ",
               rank, " maps ", foreign, " peer windows; expected 1 to ", shm::Arena::kPeerMappings);
  };
  EXPECT_EQ(runProcessRanks(2, windowsFrom(1), body, 120s), "");
}

// The measured defaults: an all-reduce of window buffers below 16 KiB stays staged (no peer
// window is mapped); from 16 KiB it takes the window path.
TEST(ShmWindowProcesses, DefaultSizesKeepSmallAllReducesStaged) {
  auto body = [&](int, Context* ctx) {
    CollectiveOptions opts;
    auto win = Window::allocate(1 << 20);
    auto* f = static_cast<float*>(win->data());
    for (size_t count : {size_t{1} << 10, size_t{1} << 12}) {  // 4 KiB, then 16 KiB
      for (size_t i = 0; i < count; ++i) f[i] = 1.0f;
      ++opts.seq;
      allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
      for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(f[i], 2.0f);
      const int foreign = foreignWindowMappings({win});
      LOOM_CHECK_EQ(foreign, count < (size_t{1} << 12) ? 0 : 1, "after an all-reduce of ",
                    count * 4, " bytes");
    }
  };
  EXPECT_EQ(runProcessRanks(2, windowsFrom(0), body), "");
}

// A peer stopped (SIGSTOP) or killed (SIGKILL) at a moment of its own choosing inside a loop
// of one-pass window all-reduces, so mostly in the middle of one (while it reduces its segment
// into every peer's window, or waits for their "reduced" marks): the others fail with an
// IoError naming it, within seconds of the collective's timeout for the stopped one, and for
// the killed one within seconds and not as a timeout; no call the victim did not finish
// returns.
TEST(ShmWindowProcesses, PeerStoppedOrKilledMidAllReduceFailsTheOthersNamingIt) {
  for (int sig : {SIGSTOP, SIGKILL}) {
    loom::testing::TempDir dir;
    loom::testing::ChildProcesses children;
    const int size = 3;
    const int victim = 2;
    children.spawnRanks(size, [&](int rank) {
      FileStore store(dir.file("store"));
      ContextOptions o = options();
      o.shmWindowMinBytes = 1;
      auto ctx = Context::create(store, rank, size, o);
      const size_t count = size_t{2} << 20;  // 8 MiB: a few ms per call
      auto win = Window::allocate(count * sizeof(float));
      auto* f = static_cast<float*>(win->data());
      std::thread stopper;
      if (rank == victim) {
        stopper = std::thread([sig] {
          std::this_thread::sleep_for(300ms);
          ::raise(sig);
        });
        stopper.detach();
      }
      CollectiveOptions opts;
      opts.timeout = 1s;
      const auto began = std::chrono::steady_clock::now();
      for (uint64_t seq = 1;; ++seq) {
        for (size_t i = 0; i < count; i += 4096) f[i] = 1.0f;
        opts.seq = seq;
        const auto start = std::chrono::steady_clock::now();
        try {
          allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
        } catch (const IoError& e) {
          const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
              std::chrono::steady_clock::now() - start);
          std::fprintf(stderr, "rank %d, %s: %s\n", rank, ::strsignal(sig), e.what());
          LOOM_CHECK(rank != victim, "the victim itself failed: ", e.what());
          if (sig == SIGKILL) {
            loom::testing::checkDeadPeerError(e, waited, 10s, "rank 2");
          } else {
            LOOM_CHECK(waited < 5s, "the error took ", waited.count(), " ms: ", e.what());
            LOOM_CHECK(std::string(e.what()).find("rank 2") != std::string::npos,
                       "the error does not name rank 2: ", e.what());
          }
          return;
        }
        for (size_t i = 0; i < count; i += 4096) LOOM_CHECK_EQ(f[i], 3.0f, "call #", seq);
        LOOM_CHECK(std::chrono::steady_clock::now() - began < 60s, "rank ", rank,
                   " never saw the failure");
      }
    });
    for (int rank = 0; rank < size; ++rank) {
      if (rank == victim) continue;
      const auto e = children.wait(rank, 60s);
      EXPECT_TRUE(e.ok()) << strsignal(sig) << ", rank " << rank << ": " << e.describe();
    }
    if (sig == SIGSTOP) children.kill(victim, SIGKILL);
    EXPECT_EQ(children.wait(victim, 10s).signal, SIGKILL) << strsignal(sig);
  }
}

// Rank 0 passes a window, rank 1 ordinary memory: both fail at once with the two paths named,
// for the all-reduce and for the reduce (whose root output does not decide the path).
TEST(ShmWindowProcesses, RanksThatDisagreeFailOnEveryRankNamingBothPaths) {
  for (const char* collective : {"all-reduce", "reduce"}) {
    auto body = [&](int rank, Context* ctx) {
      const size_t count = 256 << 10;
      std::shared_ptr<Window> win;
      std::vector<float> ordinary;
      float* buf = nullptr;
      if (rank == 0) {
        win = Window::allocate(count * sizeof(float));
        buf = static_cast<float*>(win->data());
      } else {
        ordinary.assign(count, 1.0f);
        buf = ordinary.data();
      }
      CollectiveOptions opts;
      opts.seq = 1;
      const auto start = std::chrono::steady_clock::now();
      try {
        if (std::string(collective) == "reduce") {
          reduce(*ctx, buf, buf, count, DType::kFloat32, ReduceOp::kSum, 1, opts);
        } else {
          allreduce(*ctx, buf, buf, count, DType::kFloat32, ReduceOp::kSum, opts);
        }
      } catch (const Error& e) {
        const std::string what = e.what();
        LOOM_CHECK(what.find("zero-copy window") != std::string::npos &&
                       what.find("staged") != std::string::npos,
                   "rank ", rank, ": the error does not name both paths: ", what);
        LOOM_CHECK(std::chrono::steady_clock::now() - start < 10s, "rank ", rank,
                   " failed only after ", (std::chrono::steady_clock::now() - start) / 1ms, " ms");
        return;
      }
      LOOM_THROW(Error, "rank ", rank, ": a window rank and a staged rank completed the ",
                 collective);
    };
    EXPECT_EQ(runProcessRanks(2, windowsFrom(0), body), "") << collective;
  }
}

// LOOM_SHM_WINDOWS=0 on one rank: no rank takes the window path, window buffers are reduced
// through the slots, and the results are the same.
TEST(ShmWindowProcesses, OneRankWithWindowsOffKeepsEveryRankStaged) {
  auto withRank1Off = [](int rank) {
    ContextOptions o = options();
    o.shmWindows = rank != 1;
    return o;
  };
  auto body = [&](int rank, Context* ctx) {
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena across processes");
    LOOM_CHECK(!arena->windows(), "rank ", rank, " kept windows on");
    LOOM_CHECK(arena->windowsFailure().find("rank 1") != std::string::npos,
               arena->windowsFailure());
    const size_t count = 300001;
    auto win = Window::allocate(count * sizeof(float));
    auto* f = static_cast<float*>(win->data());
    for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank);
    CollectiveOptions opts;
    opts.seq = 1;
    allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
    for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(f[i], 3.0f);
    LOOM_CHECK_EQ(foreignWindowMappings({win}), 0, "a peer window was mapped with windows off");
  };
  EXPECT_EQ(runProcessRanks(3, withRank1Off, body), "");
}

// The root helps copy a window broadcast exactly when that lowers the busiest core's share.
TEST(ShmWindow, BroadcastRootAssistsWhenItSpreadsTheCopying) {
  EXPECT_TRUE(shm::broadcastRootAssists(2, 2));   // 1/2 a buffer per core instead of 1
  EXPECT_FALSE(shm::broadcastRootAssists(3, 2));  // 4/3 instead of 1
  EXPECT_TRUE(shm::broadcastRootAssists(4, 2));   // 3/2 instead of 2
  EXPECT_FALSE(shm::broadcastRootAssists(5, 2));  // 12/5 instead of 2
  EXPECT_TRUE(shm::broadcastRootAssists(8, 2));   // 7/2 instead of 4
  EXPECT_TRUE(shm::broadcastRootAssists(3, 4));
  EXPECT_TRUE(shm::broadcastRootAssists(8, 8));
  EXPECT_FALSE(shm::broadcastRootAssists(2, 1));  // one core: the same work either way
  EXPECT_FALSE(shm::broadcastRootAssists(1, 2));
}

// A window broadcast from either root, whether the root helps copy (a core per rank) or not
// (the root pinned to one CPU before its Context starts: it decides alone, the receivers follow
// what it posts): every receiver gets every byte, whatever it held before, and buffers that do
// not start their window or divide evenly included; up to outputs that are streamed, as is a
// large in-place all-gather's.
TEST(ShmWindowProcesses, BroadcastIsRightWithAndWithoutTheRootsHelp) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "one CPU: the root never helps";
  for (bool pinRoot : {false, true}) {
    for (int root : {0, 1}) {
      auto optionsOf = [&](int rank) {
        if (pinRoot && rank == root) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(static_cast<int>(::sched_getcpu()), &one);
          LOOM_CHECK(::sched_setaffinity(0, sizeof(one), &one) == 0, "sched_setaffinity failed");
        }
        return windowsFrom(1)(rank);
      };
      auto body = [&](int rank, Context* ctx) {
        shm::Arena* arena = shm::arenaOf(*ctx);
        LOOM_CHECK(arena != nullptr && arena->windows(), "no window path");
        if (rank == root) {
          LOOM_CHECK_EQ(shm::broadcastRootAssists(2, arena->cpus()), !pinRoot,
                        "the root's choice (", arena->cpus(), " CPUs)");
        }
        CollectiveOptions opts;
        // The largest goes around the cache (non-temporal stores from 8 MiB, stream_copy.h).
        for (size_t count : {size_t{1}, size_t{5}, size_t{4099}, size_t{1100007}}) {
          auto win = Window::allocate(128 + count * sizeof(int64_t));
          auto* b = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(win->data()) + 128);
          for (size_t i = 0; i < count; ++i) {
            b[i] = rank == root ? static_cast<int64_t>(i * 2654435761u) : -7 - rank;
          }
          ++opts.seq;
          broadcast(*ctx, b, count, DType::kInt64, root, opts);
          for (size_t i = 0; i < count; ++i) {
            LOOM_CHECK_EQ(b[i], static_cast<int64_t>(i * 2654435761u), "element ", i, " of ", count,
                          " from root ", root);
          }
        }
        // An all-gather whose output (9 MiB) is streamed too, in place.
        const size_t count = 1179649;
        auto win = Window::allocate(count * 2 * sizeof(int32_t));
        auto* all = static_cast<int32_t*>(win->data());
        for (size_t i = 0; i < 2 * count; ++i) all[i] = -1;
        for (size_t i = 0; i < count; ++i)
          all[rank * count + i] = rank * 7 + static_cast<int>(i % 977);
        ++opts.seq;
        allgather(*ctx, all + rank * count, all, count, DType::kInt32, opts);
        for (size_t i = 0; i < 2 * count; ++i) {
          LOOM_CHECK_EQ(all[i], static_cast<int>(i / count) * 7 + static_cast<int>(i % count % 977),
                        "all-gather at ", i);
        }
      };
      EXPECT_EQ(runProcessRanks(2, optionsOf, body), "")
          << "root " << root << (pinRoot ? ", pinned to one CPU" : "");
    }
  }
}

// Threads as ranks (one process; each rank still maps its peers' windows, as it maps the arena,
// so that every rank reads shared memory through its own mapping and the arena's counters order
// it): the same results. Last in the file: the process tests fork before any thread exists.
TEST(ShmWindowThreads, EveryCollectiveBetweenThreadRanks) {
  const int size = 3;
  HashStore store;
  loom::testing::runThreadRanks(size, [&](int rank) {
    ContextOptions o = options();
    o.shmWindowMinBytes = 1;
    auto ctx = Context::create(store, rank, size, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr && arena->windows(), "no window path between thread ranks");
    CollectiveOptions opts;
    const size_t count = 100003;
    auto win = Window::allocate(count * 4 * (size + 2));
    auto* f = static_cast<float*>(win->data());
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank + k);
      ++opts.seq;
      allreduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, opts);
      for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(f[i], static_cast<float>(3 + 3 * k));
      auto* all = reinterpret_cast<int32_t*>(f + count);
      auto* in = reinterpret_cast<int32_t*>(f);
      for (size_t i = 0; i < count; ++i) in[i] = rank * 10 + k;
      ++opts.seq;
      allgather(*ctx, in, all, count, DType::kInt32, opts);
      for (size_t i = 0; i < count * size; ++i) {
        LOOM_CHECK_EQ(all[i], static_cast<int>(i / count) * 10 + k);
      }
      ++opts.seq;
      reduceScatter(*ctx, all, in, count, DType::kInt32, ReduceOp::kMax, opts);
      for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(in[i], rank * 10 + k);
      for (size_t i = 0; i < count; ++i) in[i] = rank == 1 ? k : -1;
      ++opts.seq;
      broadcast(*ctx, in, count, DType::kInt32, 1, opts);
      for (size_t i = 0; i < count; ++i) LOOM_CHECK_EQ(in[i], k);
      // A float reduce to rank 2 gives the staged path's bits: the same values reduced from
      // ordinary memory (staged) and in place in the windows.
      const int root = 2;
      std::vector<float> staged(count), stagedOut(count);
      for (size_t i = 0; i < count; ++i) {
        staged[i] = f[i] =
            std::ldexp(static_cast<float>((i * 2654435761u + rank * 40503u) % 1000003),
                       -static_cast<int>(i % 23)) *
            (rank == 1 ? -1.0f : 1.0f);
      }
      ++opts.seq;
      reduce(*ctx, staged.data(), stagedOut.data(), count, DType::kFloat32, ReduceOp::kSum, root,
             opts);
      ++opts.seq;
      reduce(*ctx, f, f, count, DType::kFloat32, ReduceOp::kSum, root, opts);
      if (rank == root) {
        LOOM_CHECK(std::memcmp(f, stagedOut.data(), count * sizeof(float)) == 0,
                   "the window reduce's bits differ from the staged path's");
      } else {
        LOOM_CHECK(std::memcmp(f, staged.data(), count * sizeof(float)) == 0, "rank ", rank,
                   "'s input changed");
      }
    }
  });
}

}  // namespace
}  // namespace loom::comm::testing
