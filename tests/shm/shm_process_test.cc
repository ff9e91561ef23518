// Process ranks (forked before any thread exists) over a directory store: the shared-memory
// collectives across real processes; the segment's name is gone from /dev/shm as soon as
// every rank is connected and stays gone after the job is SIGKILLed; a SIGKILLed peer is an
// IoError naming it within seconds (not a timeout, not a hang); a SIGSTOPped peer is a
// TimeoutError naming it after the collective's timeout, and every other rank fails with it;
// ranks split into "hosts" (ContextOptions::shmHostId) run the hierarchical all-reduce and
// route point-to-point through shared memory or tcp by host; a peer killed during send/recv is
// an IoError naming it; rank 0 killed inside segment creation leaves nothing in /dev/shm; the
// named-segment fallback (ContextOptions::shmMemfd = false) works and is unlinked once every
// rank mapped it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "killed_peer_case.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/comm/tuning.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "shm/arena.h"
#include "shm/hierarchy.h"
#include "shm/ptrace.h"
#include "shm/segment.h"
#include "shm/shm.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ContextOptions options() {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 20s;
  return o;
}

bool shmNameExists(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

void writeFile(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Polls for a file the children write (the parent has no other channel to them).
bool waitForFile(const std::string& path, std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  struct stat st {};
  while (::stat(path.c_str(), &st) != 0) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(5ms);  // poll interval, bounded by the deadline
  }
  return true;
}

// Every collective with the single-copy path (process_vm_readv between the ranks' processes)
// forced at every size, and forced off.
TEST(ShmProcesses, EveryCollectiveAcrossProcesses) {
  for (ShmSingleCopy mode : {ShmSingleCopy::kOn, ShmSingleCopy::kOff})
    for (int size : {2, 4}) {
      loom::testing::TempDir dir;
      loom::testing::ChildProcesses children;
      children.spawnRanks(size, [&](int rank) {
        FileStore store(dir.file("store"));
        ContextOptions o = options();
        o.shmSingleCopy = mode;
        auto ctx = Context::create(store, rank, size, o);
        shm::Arena* arena = shm::arenaOf(*ctx);
        LOOM_CHECK(arena != nullptr, "no arena across processes");
        LOOM_CHECK_EQ(arena->singleCopy(), mode == ShmSingleCopy::kOn, arena->singleCopyFailure());
        CollectiveOptions opts;
        const int sum = size * (size + 1) / 2;
        for (size_t count : {size_t{1}, size_t{3000}, size_t{300001}}) {
          std::vector<float> buf(count, rank + 1.0f);
          ++opts.seq;
          allreduce(*ctx, buf.data(), buf.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
          for (float v : buf) LOOM_CHECK_EQ(v, static_cast<float>(sum));
          std::vector<int64_t> b(count, rank == 1 ? 42 : 0);
          ++opts.seq;
          broadcast(*ctx, b.data(), count, DType::kInt64, 1, opts);
          for (int64_t v : b) LOOM_CHECK_EQ(v, 42);
          std::vector<int32_t> in(count, rank), all(count * size, -1);
          ++opts.seq;
          allgather(*ctx, in.data(), all.data(), count, DType::kInt32, opts);
          for (size_t i = 0; i < all.size(); ++i)
            LOOM_CHECK_EQ(all[i], static_cast<int>(i / count));
          std::vector<int32_t> rs(count, -1);
          ++opts.seq;
          reduceScatter(*ctx, all.data(), rs.data(), count, DType::kInt32, ReduceOp::kSum, opts);
          for (int32_t v : rs) LOOM_CHECK_EQ(v, rank * size);
          ++opts.seq;
          barrier(*ctx, opts);
        }
      });
      EXPECT_EQ(children.waitAllOk(90s), "")
          << "world size " << size << ", single copy " << static_cast<int>(mode);
    }
}

// One rank with the single-copy path off turns it off on every rank (no rank is left waiting
// for another's probe), and the collectives still agree.
TEST(ShmProcesses, OneRankWithSingleCopyOffTurnsItOffForAll) {
  const int size = 3;
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.shmSingleCopy = rank == 1 ? ShmSingleCopy::kOff : ShmSingleCopy::kOn;
    auto ctx = Context::create(store, rank, size, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena across processes");
    LOOM_CHECK(!arena->singleCopy(), "rank ", rank, " kept single copy on");
    LOOM_CHECK(
        arena->singleCopyFailure().find("rank 1 has LOOM_SHM_SINGLE_COPY=off") != std::string::npos,
        arena->singleCopyFailure());
    std::vector<float> buf(size_t{1} << 20, rank + 1.0f);
    CollectiveOptions opts;
    allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum, opts);
    for (float v : buf) LOOM_CHECK_EQ(v, 6.0f);
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

// A tuning file's OP.cma_min / OP.cma_max (loom/comm/tuning.h) turn the single copy on for
// those sizes only; the results are those of the staged path. A rank whose file says
// otherwise runs rank 0's table all the same, and is named.
TEST(ShmProcesses, ATuningFileChoosesTheSingleCopyForItsSizes) {
  const int size = 2;
  loom::testing::TempDir dir;
  comm::Crossovers x = comm::builtinCrossovers(size);
  x.allgatherCma = {4096, 65536};
  const std::string tuned = dir.file("tuned.txt");
  std::ofstream(tuned) << comm::formatTuning(comm::topologyKey(size, size, "shm"), x, true);
  loom::testing::ChildProcesses children;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.tuningFile = tuned;
    auto ctx = Context::create(store, rank, size, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena across processes");
    LOOM_CHECK(arena->singleCopy() && !arena->singleCopyForced(), arena->singleCopyFailure());
    LOOM_CHECK(ctx->crossMemory(), "Context::crossMemory() is false");
    LOOM_CHECK(arena->crossMemoryFor(OpType::kAllgather, 4096), "4 KiB all-gather stays staged");
    LOOM_CHECK(arena->crossMemoryFor(OpType::kAllgather, 65536), "64 KiB all-gather stays staged");
    LOOM_CHECK(!arena->crossMemoryFor(OpType::kAllgather, 65540), "all-gather above the range");
    LOOM_CHECK(!arena->crossMemoryFor(OpType::kAllgather, 4092), "all-gather below the range");
    LOOM_CHECK(!arena->crossMemoryFor(OpType::kAllreduce, 8192), "all-reduce is not tuned");
    CollectiveOptions opts;
    for (size_t count : {size_t{100}, size_t{4096}, size_t{50000}}) {  // 400 B, 16 KiB, 200 KB
      std::vector<int32_t> in(count), all(count * size, -1);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(rank * 1000003 + i);
      ++opts.seq;
      allgather(*ctx, in.data(), all.data(), count, DType::kInt32, opts);
      for (size_t i = 0; i < all.size(); ++i) {
        LOOM_CHECK_EQ(all[i], static_cast<int32_t>((i / count) * 1000003 + i % count));
      }
    }
  });
  EXPECT_EQ(children.waitAllOk(60s), "");

  // Rank 1 without the file: every rank runs rank 0's table (tuning_cache.h), so both read
  // with the single copy at 16 KiB per rank, and both Contexts name rank 1's other tuning.
  loom::testing::TempDir dir2;
  loom::testing::ChildProcesses disagree;
  disagree.spawnRanks(size, [&](int rank) {
    FileStore store(dir2.file("store"));
    ContextOptions o = options();
    o.tuningCache = "off";
    if (rank == 0) o.tuningFile = tuned;
    auto ctx = Context::create(store, rank, size, o);
    LOOM_CHECK(ctx->tuning().find("rank 1 has built-in") != std::string::npos, ctx->tuning());
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr && arena->crossMemoryFor(OpType::kAllgather, 16384), "rank ", rank,
               " does not run rank 0's table: ", ctx->tuning());
    std::vector<int32_t> in(4096, rank), all(4096 * size);
    CollectiveOptions opts;
    opts.seq = 1;
    allgather(*ctx, in.data(), all.data(), in.size(), DType::kInt32, opts);
    for (size_t i = 0; i < all.size(); ++i) LOOM_CHECK_EQ(all[i], static_cast<int32_t>(i / 4096));
  });
  EXPECT_EQ(disagree.waitAllOk(60s), "");
}

TEST(ShmProcesses, SigkilledJobLeavesNothingInDevShm) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, options());
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena");
    CollectiveOptions opts;
    opts.seq = 1;
    barrier(*ctx, opts);  // every rank has returned from create: every rank mapped it
    if (rank == 0) {
      LOOM_CHECK(!shmNameExists(arena->segmentName()), arena->segmentName(),
                 " still exists in /dev/shm after every rank connected");
      writeFile(dir.file("segment"), arena->segmentName());
    }
    std::vector<float> buf(100000, 1.0f);
    for (uint64_t seq = 2;; ++seq) {
      opts.seq = seq;
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kMax, opts);
      if (rank == 0 && seq == 50) writeFile(dir.file("running"), "1");
    }
  });
  ASSERT_TRUE(waitForFile(dir.file("running"), 60s)) << children.waitAllOk(1ms);
  const std::string name = readFile(dir.file("segment"));
  ASSERT_FALSE(name.empty());
  for (int i = 0; i < size; ++i) children.kill(i, SIGKILL);
  for (const auto& e : children.waitAll(30s)) EXPECT_EQ(e.signal, SIGKILL) << e.describe();
  EXPECT_FALSE(shmNameExists(name)) << name << " leaked";
}

TEST(ShmProcesses, KilledPeerIsAnIoErrorNamingItWithinSeconds) {
  KilledPeerCase c;
  c.size = 4;
  c.killAt = 30;
  c.count = [](uint64_t seq) { return seq % 2 == 0 ? size_t{2} : size_t{50000}; };  // small, split
  c.check = [](Context& ctx) { LOOM_CHECK(shm::arenaOf(ctx) != nullptr, "no arena"); };
  runKilledPeerCase(options(), c);
}

// The same with helper threads copying (ContextOptions::shmCopyThreads = 2, 4 MiB all-reduces:
// most of each step is the helpers' copies and folds), the peer SIGKILLed by a thread of its own
// at a moment of its loop, not between two calls.
TEST(ShmProcesses, KilledPeerWhileHelpersCopyIsAnIoErrorNamingIt) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  const int victim = 2;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.shmCopyThreads = 2;
    auto ctx = Context::create(store, rank, size, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr && arena->copyThreads() == 2, "no arena with 2 helpers");
    CollectiveOptions opts;
    opts.timeout = 60s;
    std::vector<float> buf(1 << 20, 1.0f);
    for (uint64_t seq = 1;; ++seq) {
      if (rank == victim && seq == 3) {
        std::thread([] {
          std::this_thread::sleep_for(3ms);
          ::kill(::getpid(), SIGKILL);
        }).detach();
      }
      opts.seq = seq;
      const auto start = Clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kMax, opts);
      } catch (const IoError& e) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        loom::testing::checkDeadPeerError(e, waited, 5s, "rank 2");
        LOOM_CHECK(arena->helperThreadsRunning() == 2, "the helpers never ran");
        return;
      }
      LOOM_CHECK(seq < 1000000, "never saw the failure");
    }
  });
  loom::testing::expectOnlyVictimKilled(children.waitAll(60s), victim);
}

TEST(ShmProcesses, StoppedPeerIsATimeoutNamingIt) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  const int victim = 1;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, options());
    CollectiveOptions opts;
    opts.timeout = 1s;
    std::vector<double> buf(1000, 1.0);
    for (uint64_t seq = 1;; ++seq) {
      if (rank == victim && seq == 10) ::raise(SIGSTOP);
      opts.seq = seq;
      const auto start = Clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat64, ReduceOp::kMin, opts);
      } catch (const IoError& e) {
        const auto waited = Clock::now() - start;
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        LOOM_CHECK(waited < 3s, "the error took ",
                   std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(), " ms");
        LOOM_CHECK(std::string(e.what()).find("rank 1") != std::string::npos,
                   "the error does not name rank 1: ", e.what());
        return;
      }
      LOOM_CHECK(seq < 1000000, "never saw the failure");
    }
  });
  for (int rank = 0; rank < size; ++rank) {
    if (rank == victim) continue;
    const auto e = children.wait(rank, 30s);
    EXPECT_TRUE(e.ok()) << "rank " << rank << ": " << e.describe();
  }
  children.kill(victim, SIGKILL);
  EXPECT_EQ(children.wait(victim, 10s).signal, SIGKILL);
}

TEST(ShmProcesses, HierarchicalAllreduceOverFakeHosts) {
  // Host layouts by rank: two hosts of two, interleaved hosts, and a single-rank host between
  // two shared ones.
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "b", "a", "b"}, {"a", "a", "b", "c", "c"}};
  for (const auto& layout : layouts) {
    const int size = static_cast<int>(layout.size());
    loom::testing::TempDir dir;
    loom::testing::ChildProcesses children;
    children.spawnRanks(size, [&](int rank) {
      ContextOptions o = options();
      o.shmHostId = layout[rank];
      FileStore store(dir.file("store"));
      auto ctx = Context::create(store, rank, size, o);
      LOOM_CHECK(shm::arenaOf(*ctx) == nullptr, "a multi-host context got a single arena");
      LOOM_CHECK(shm::hierarchyOf(*ctx) != nullptr, "no hierarchy");
      CollectiveOptions opts;
      const double sum = size * (size + 1) / 2.0;
      for (size_t count : {size_t{1}, size_t{5000}, size_t{300001}}) {
        std::vector<float> f(count, rank + 1.0f);
        ++opts.seq;
        allreduce(*ctx, f.data(), f.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
        for (float v : f) LOOM_CHECK_EQ(v, static_cast<float>(sum));
        std::vector<double> in(count, rank + 1.0), out(count, -1.0);
        ++opts.seq;
        allreduce(*ctx, in.data(), out.data(), count, DType::kFloat64, ReduceOp::kAvg, opts);
        for (double v : out) LOOM_CHECK_EQ(v, sum / size);
        std::vector<int32_t> m(count);
        for (size_t i = 0; i < count; ++i) m[i] = static_cast<int32_t>((i + rank) % size);
        ++opts.seq;
        allreduce(*ctx, m.data(), m.data(), count, DType::kInt32, ReduceOp::kMax, opts);
        for (int32_t v : m) LOOM_CHECK_EQ(v, size - 1);
        std::vector<int64_t> b(count, rank == size - 1 ? 7 : 0);
        ++opts.seq;
        broadcast(*ctx, b.data(), count, DType::kInt64, size - 1, opts);  // generic, over tcp
        for (int64_t v : b) LOOM_CHECK_EQ(v, 7);
      }
    });
    EXPECT_EQ(children.waitAllOk(90s), "") << "layout of " << size << " ranks";
  }
}

TEST(ShmProcesses, PointToPointOverSharedMemoryAndTcpAcrossFakeHosts) {
  // Hosts a a b b: 0<->1 and 2<->3 go through shared memory, the other pairs through tcp.
  const std::vector<std::string> layout = {"a", "a", "b", "b"};
  const int size = 4;
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(size, [&](int rank) {
    ContextOptions o = options();
    o.shmHostId = layout[rank];
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, o);
    Transport& t = ctx->transport();
    LOOM_CHECK(std::string(t.name()) == "shm+tcp", "transport is ", t.name());
    const Deadline deadline(30s);
    for (size_t n : {size_t{0}, size_t{1}, size_t{3} << 20}) {
      std::vector<std::vector<uint8_t>> out(size), in(size);
      std::vector<RequestPtr> reqs;
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        out[p].assign(n, static_cast<uint8_t>(rank * 16 + p));
        in[p].assign(n, 0xff);
        reqs.push_back(t.isend(p, out[p].data(), n, 5));
        reqs.push_back(t.irecv(p, in[p].data(), n, 5));
      }
      for (auto& r : reqs) LOOM_CHECK(r->wait(deadline), "timed out");
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        for (uint8_t v : in[p]) LOOM_CHECK_EQ(static_cast<int>(v), p * 16 + rank);
      }
    }
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

TEST(ShmProcesses, KilledPeerDuringPointToPointIsAnIoErrorNamingIt) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int victim = 1;
  children.spawnRanks(2, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, 2, options());
    LOOM_CHECK(std::string(ctx->transport().name()) == "shm+tcp", "no shm transport");
    std::vector<float> buf(100000, 1.0f);
    CollectiveOptions opts;
    opts.timeout = 60s;
    for (int i = 0;; ++i) {
      if (rank == victim && i == 20) ::kill(::getpid(), SIGKILL);
      const auto start = Clock::now();
      try {
        if (rank == 0) {
          send(*ctx, buf.data(), buf.size(), DType::kFloat32, 1, 1, opts);
          recv(*ctx, buf.data(), buf.size(), DType::kFloat32, 1, 2, opts);
        } else {
          recv(*ctx, buf.data(), buf.size(), DType::kFloat32, 0, 1, opts);
          send(*ctx, buf.data(), buf.size(), DType::kFloat32, 0, 2, opts);
        }
      } catch (const IoError& e) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        loom::testing::checkDeadPeerError(e, waited, 5s, "rank 1");
        return;
      }
      LOOM_CHECK(i < 1000000, "never saw the failure");
    }
  });
  loom::testing::expectOnlyVictimKilled(children.waitAll(60s), victim);
}

// Names in /dev/shm that a segment created by `pid` would have had.
std::vector<std::string> devShmNamesOf(pid_t pid) {
  std::vector<std::string> names;
  const std::string prefix = detail::str("loom-shm-", pid, "-");
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

TEST(ShmProcesses, RankZeroKilledInsideCreateLeavesNothing) {
  // Rank 0 creates the segment and waits for rank 1, which never comes; the job is then
  // SIGKILLed. With the memfd nothing ever had a name.
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    if (rank == 1) {
      ::pause();  // until killed
      return;
    }
    FileStore store(dir.file("store"));
    shm::ArenaOptions o;
    o.timeout = 60s;
    o.keyPrefix = "leak";
    shm::Arena::create(store, 0, 2, o);
  });
  FileStore store(dir.file("store"));
  store.wait({"leak/memfd"}, 30s);
  const pid_t pid0 = children.pid(0);
  EXPECT_TRUE(devShmNamesOf(pid0).empty());
  for (int i = 0; i < 2; ++i) children.kill(i, SIGKILL);
  for (const auto& e : children.waitAll(30s)) EXPECT_EQ(e.signal, SIGKILL) << e.describe();
  EXPECT_TRUE(devShmNamesOf(pid0).empty()) << devShmNamesOf(pid0).front() << " leaked";
}

TEST(ShmProcesses, NamedSegmentFallbackWorksAndIsUnlinked) {
  // shmMemfd = false takes the fallback used when /proc/<pid>/fd cannot be opened.
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(3, [&](int rank) {
    ContextOptions o = options();
    o.shmMemfd = false;
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, 3, o);
    shm::Arena* arena = shm::arenaOf(*ctx);
    LOOM_CHECK(arena != nullptr, "no arena");
    LOOM_CHECK(arena->segmentName().rfind("/loom-shm-", 0) == 0,
               "not a named segment: ", arena->segmentName());
    CollectiveOptions opts;
    opts.seq = 1;
    barrier(*ctx, opts);  // every rank mapped it: the name is gone
    LOOM_CHECK(!shmNameExists(arena->segmentName()), arena->segmentName(), " still exists");
    std::vector<double> buf(300001, rank + 1.0);
    opts.seq = 2;
    allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat64, ReduceOp::kSum, opts);
    for (double v : buf) LOOM_CHECK_EQ(v, 6.0);
    std::vector<int32_t> p(1000, rank);
    if (rank == 0) send(*ctx, p.data(), p.size(), DType::kInt32, 2, 3);
    if (rank == 2) {
      recv(*ctx, p.data(), p.size(), DType::kInt32, 0, 3);
      for (int32_t v : p) LOOM_CHECK_EQ(v, 0);
    }
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

// Ranks that disagree on the segment's layout (here LOOM_SHM_SLOT_BYTES) get the message that
// names the setting, on every rank, with the memfd and with the named fallback. Before, the
// memfd fell back silently to the named segment, where the other rank failed with "cannot map
// ... (N there): <a stale errno>" and rank 0 waited for it, holding the name.
TEST(ShmProcesses, RanksWithDifferentSlotSizesFailNamingTheSetting) {
  for (const bool memfd : {true, false}) {
    loom::testing::TempDir dir;
    loom::testing::ChildProcesses children;
    children.spawnRanks(2, [&](int rank) {
      FileStore store(dir.file("store"));
      shm::ArenaOptions o;
      o.timeout = memfd ? 20s : 3s;
      o.keyPrefix = "layout";
      o.memfd = memfd;
      o.slotBytes = rank == 0 ? (size_t{1} << 20) : (size_t{1} << 19);
      try {
        shm::Arena::create(store, rank, 2, o);
      } catch (const TimeoutError& e) {
        // The named segment's rank 0 learns nothing from rank 1 and times out in the setup.
        LOOM_CHECK(rank == 0 && !memfd, "rank ", rank, ": ", e.what());
        return;
      } catch (const IoError& e) {
        const std::string what = e.what();
        LOOM_CHECK(
            what.find("LOOM_SHM_SLOT_BYTES set differently on the ranks") != std::string::npos,
            "rank ", rank, ": ", what);
        FileStore(dir.file("store")).set(detail::str("failed/", rank), what);
        return;
      }
      LOOM_CHECK(false, "rank ", rank, " created a segment of another layout");
    });
    const pid_t pid0 = children.pid(0);
    EXPECT_EQ(children.waitAllOk(60s), "") << (memfd ? "memfd" : "named");
    FileStore store(dir.file("store"));
    EXPECT_TRUE(store.check({"failed/1"})) << (memfd ? "memfd" : "named");
    if (memfd) {
      EXPECT_TRUE(store.check({"failed/0"}));
    }
    EXPECT_TRUE(devShmNamesOf(pid0).empty()) << devShmNamesOf(pid0).front() << " leaked";
  }
}

// A named segment whose creator is gone and that is an hour old is removed by the next one
// made on the host; a fresh one, or one whose creator lives, is left alone.
TEST(ShmProcesses, StaleNamedSegmentsOfDeadCreatorsAreSweptAway) {
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  auto make = [](const std::string& name, bool old) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    LOOM_CHECK(fd >= 0, "shm_open ", name, ": ", detail::errnoText(errno));
    LOOM_CHECK(::ftruncate(fd, 4096) == 0, "ftruncate");
    if (old) {
      const timespec times[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
      LOOM_CHECK(::futimens(fd, times) == 0, "futimens");
    }
    ::close(fd);
  };
  const std::string stale = detail::str("/loom-shm-", dead, "-0000000000000001");
  const std::string fresh = detail::str("/loom-shm-", dead, "-0000000000000002");
  const std::string alive = detail::str("/loom-shm-", ::getpid(), "-0000000000000003");
  make(stale, true);
  make(fresh, false);
  make(alive, true);
  EXPECT_GE(shm::sweepStaleNamedSegments(shm::kStaleNamedSegmentAge), 1);
  EXPECT_FALSE(shmNameExists(stale));
  EXPECT_TRUE(shmNameExists(fresh));
  EXPECT_TRUE(shmNameExists(alive));
  ::shm_unlink(fresh.c_str());
  ::shm_unlink(alive.c_str());
}

// Two children of this process that wait (for "done" in dir's store) while a test names them.
void spawnTwoWaiting(loom::testing::ChildProcesses& children, loom::testing::TempDir& dir) {
  for (int i = 0; i < 2; ++i) {
    children.spawn([&dir] {
      FileStore store(dir.file("store"));
      store.wait({"done"}, 60s);
    });
  }
}

// Yama keeps one reader's name per process, and several groups may need one (shm/ptrace.h):
// the name always covers every held grant's readers, so a second group's grant widens it (here
// from the one peer to the test process, the peers' common ancestor) instead of taking the
// first group's reader away; ending a grant narrows it again, and the last withdraws it (also
// on an arena's destruction, arena.cc). A grant whose readers share no ancestor but init with
// the held ones is refused with the reason, and the name stays. This machine may have no Yama,
// so the prctl is replaced and the names are read back from the registry.
std::vector<pid_t> gPtracerCalls;
int recordPtracerCall(pid_t pid) {
  gPtracerCalls.push_back(pid);
  return 0;
}

TEST(ShmProcesses, OneReadersNameCoversTheReadersOfEveryGroupThatNeedsOne) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  spawnTwoWaiting(children, dir);
  const pid_t a = children.pid(0), b = children.pid(1), self = ::getpid();
  shm::setPtracerCallForTest(recordPtracerCall);
  ASSERT_EQ(shm::readGrants(), 0);
  int pair = 0, world = 0, alone = 0, stranger = 0;
  EXPECT_EQ(shm::grantReads({self}, alone), "");  // no reader: nothing named
  EXPECT_EQ(alone, 0);
  EXPECT_EQ(shm::grantReads({self, a}, pair), "");  // a subgroup with one peer: that peer
  EXPECT_NE(pair, 0);
  EXPECT_EQ(shm::namedReader(), a);
  EXPECT_EQ(shm::grantReads({self, a, b}, world), "");  // a group with both: their ancestor
  EXPECT_NE(world, 0);
  EXPECT_EQ(shm::namedReader(), self);
  const std::string why = shm::grantReads({self, 1}, stranger);  // init's child: refused
  EXPECT_EQ(stranger, 0);
  EXPECT_NE(why.find("other group(s) of this process"), std::string::npos) << why;
  EXPECT_EQ(shm::namedReader(), self);
  EXPECT_EQ(shm::readGrants(), 2);
  shm::endGrant(world);  // narrows back to the pair's one reader
  EXPECT_EQ(shm::namedReader(), a);
  shm::endGrant(world);  // ended already: nothing changes
  shm::endGrant(0);
  EXPECT_EQ(shm::readGrants(), 1);
  shm::endGrant(pair);  // the last: withdrawn
  EXPECT_EQ(shm::namedReader(), 0);
  EXPECT_EQ(shm::readGrants(), 0);
  EXPECT_EQ(gPtracerCalls, (std::vector<pid_t>{a, self, a, 0}));
  shm::setPtracerCallForTest(nullptr);
  FileStore(dir.file("store")).set("done", "1");
  EXPECT_EQ(children.waitAllOk(60s), "");
}

// The reader a rank names for the single copy under Yama's ptrace_scope 1 (shm/ptrace.h): the
// one peer itself; for several peers their nearest common ancestor (here the test process,
// which forked them), never "any process"; nobody for a rank alone in its process. (This
// machine may have no Yama: only the choice is checked here, not the kernel's answer.)
TEST(ShmProcesses, PtracerIsThePeerOrThePeersCommonAncestor) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  spawnTwoWaiting(children, dir);
  const pid_t a = children.pid(0), b = children.pid(1), self = ::getpid();
  std::string why;
  EXPECT_EQ(shm::ptracerFor({self}, why), 0);
  EXPECT_EQ(why, "");
  EXPECT_EQ(shm::ptracerFor({a}, why), a);
  EXPECT_EQ(shm::ptracerFor({self, a}, why), a);
  EXPECT_EQ(shm::ptracerFor({a, b}, why), self) << why;
  EXPECT_EQ(shm::ptracerFor({self, a, b}, why), self) << why;
  // A process outside the tree (init's child only shares init): none, and why.
  EXPECT_EQ(shm::ptracerFor({a, 1}, why), 0);
  EXPECT_NE(why.find("PR_SET_PTRACER_ANY"), std::string::npos) << why;
  std::fprintf(stderr, "Yama ptrace_scope here: %d\n", shm::yamaPtraceScope());
  FileStore(dir.file("store")).set("done", "1");
  EXPECT_EQ(children.waitAllOk(60s), "");
}

}  // namespace
}  // namespace loom::comm::testing
