// The mpi backend's point-to-point operations, subgroups and threads, under mpirun (2 and 4
// ranks): send / recv with tags in a ring (both orders, large enough for MPI's rendezvous
// protocol), receives from any source naming their sender, batched send / recv, newGroup
// (members, non-members, nested, a rank list that differs between ranks), and two groups used
// from two threads at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mpi.h>

#include <set>
#include <thread>

#include "loom/common/error.h"
#include "loom/process_group/init.h"
#include "loom/testing/ranks.h"
#include "mpi_test_support.h"

namespace loom::mpi_testing {
namespace {

using ::testing::HasSubstr;

// mpiWorld() reports what MPI provides and who initialized it (this binary runs both ways:
// Loom initializing MPI, and the program with MPI_THREAD_SERIALIZED, see CMakeLists.txt).
TEST(MpiRuntime, ReportsMpisWorldAndThreadLevel) {
  const MpiWorld w = mpiWorld();
  int rank = -1, size = -1, provided = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Query_thread(&provided);
  EXPECT_EQ(w.rank, rank);
  EXPECT_EQ(w.size, size);
  EXPECT_EQ(w.threadLevel,
            provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED");
#ifdef LOOM_MPI_TEST_OWN_INIT
  EXPECT_FALSE(w.initializedByLoom);
  EXPECT_EQ(provided, LOOM_MPI_TEST_OWN_INIT);
#else
  EXPECT_TRUE(w.initializedByLoom);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE) << "Debian's Open MPI provides MPI_THREAD_MULTIPLE";
#endif
  EXPECT_THAT(w.library, HasSubstr("Open MPI"));
  EXPECT_THAT(world().transportSummary(), HasSubstr(w.threadLevel));
}

TEST(MpiPointToPoint, RingWithTagsBothOrders) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // 1 element and 4 MB (past Open MPI's eager limit: a send completes only once received).
  for (size_t n : {size_t{1}, size_t{1} << 20}) {
    for (int order = 0; order < 2; ++order) {
      std::vector<int32_t> a(n, r * 10 + 1), b(n, r * 10 + 2), gotA(n, -1), gotB(n, -1);
      std::vector<std::shared_ptr<Work>> works;
      // Two messages to the same peer told apart by their tags, received in the other order.
      if (order == 0) {
        works.push_back(pg.send(view(a.data(), n), next, /*tag=*/11));
        works.push_back(pg.send(view(b.data(), n), next, /*tag=*/22));
        works.push_back(pg.recv(view(gotB.data(), n), prev, 22));
        works.push_back(pg.recv(view(gotA.data(), n), prev, 11));
      } else {
        works.push_back(pg.recv(view(gotB.data(), n), prev, 22));
        works.push_back(pg.recv(view(gotA.data(), n), prev, 11));
        works.push_back(pg.send(view(a.data(), n), next, 11));
        works.push_back(pg.send(view(b.data(), n), next, 22));
      }
      for (auto& w : works) EXPECT_TRUE(w->wait());
      EXPECT_EQ(gotA[n - 1], prev * 10 + 1) << "tag 11, " << n << " elements, order " << order;
      EXPECT_EQ(gotB[0], prev * 10 + 2) << "tag 22, " << n << " elements, order " << order;
      const auto& recvA = order == 0 ? works[3] : works[1];
      EXPECT_EQ(recvA->sourceRank(), prev);
    }
  }
}

TEST(MpiPointToPoint, RecvAnySourceNamesTheSender) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  if (r == 0) {
    std::set<int> senders;
    for (int k = 1; k < p; ++k) {
      int32_t got = -1;
      auto w = pg.recvAnySource(view(&got, 1), /*tag=*/5);
      EXPECT_TRUE(w->wait());
      EXPECT_EQ(got, w->sourceRank() * 100) << "the value names its sender";
      senders.insert(w->sourceRank());
    }
    EXPECT_EQ(static_cast<int>(senders.size()), p - 1);
  } else {
    int32_t mine = r * 100;
    pg.send(view(&mine, 1), 0, 5)->wait();
  }
  pg.barrier()->wait();
}

TEST(MpiPointToPoint, BatchSendRecv) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  std::vector<double> out(1000, r + 0.5), in(1000, -1);
  std::vector<PointToPointOp> ops = {
      {OpType::kRecv, view(in.data(), in.size()), (r + p - 1) % p, 3},
      {OpType::kSend, view(out.data(), out.size()), (r + 1) % p, 3},
  };
  for (auto& w : pg.batchSendRecv(ops)) EXPECT_TRUE(w->wait());
  EXPECT_EQ(in[999], (r + p - 1) % p + 0.5);
}

TEST(MpiSubgroup, MembersNonMembersAndNesting) {
  ProcessGroup& pg = world();
  const int p = pg.size(), r = pg.rank();
  // The odd ranks, given unsorted; their group ranks follow the sorted order.
  std::vector<int> odd;
  for (int k = p - 1; k >= 0; --k) {
    if (k % 2 == 1) odd.push_back(k);
  }
  auto sub = newGroup(pg, odd);
  if (r % 2 == 0) {
    EXPECT_EQ(sub, nullptr);
  } else {
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->backendName(), "mpi");
    EXPECT_EQ(sub->size(), static_cast<int>(odd.size()));
    EXPECT_EQ(sub->rank(), r / 2);
    EXPECT_THAT(sub->who(), HasSubstr("of group/"));
    int64_t v = r;
    sub->allreduce(view(&v, 1))->wait();
    int64_t want = 0;
    for (int k : odd) want += k;
    EXPECT_EQ(v, want);
    // A subgroup of the subgroup: its rank 0 alone.
    auto nested = newGroup(*sub, {0});
    if (sub->rank() == 0) {
      ASSERT_NE(nested, nullptr);
      EXPECT_EQ(nested->size(), 1);
      int32_t x = 7;
      nested->allreduce(view(&x, 1))->wait();
      EXPECT_EQ(x, 7);
    } else {
      EXPECT_EQ(nested, nullptr);
    }
  }
  // The world group is unaffected.
  int32_t all = 1;
  pg.allreduce(view(&all, 1))->wait();
  EXPECT_EQ(all, p);
}

TEST(MpiSubgroup, DifferentRankListsFailOnEveryRank) {
  ProcessGroup& pg = world();
  const std::vector<int> ranks = pg.rank() == 0 ? std::vector<int>{0} : std::vector<int>{0, 1};
  try {
    newGroup(pg, ranks);
    ADD_FAILURE() << "rank " << pg.rank() << ": newGroup with differing lists did not throw";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("passed a different list"));
    EXPECT_THAT(e.what(), HasSubstr(pg.rank() == 0 ? "but ranks [1" : "but ranks [0]"));
  }
  // The parent is still usable.
  pg.barrier()->wait();
}

TEST(MpiThreads, TwoGroupsFromTwoThreads) {
  ProcessGroup& pg = world();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  auto a = createProcessGroup("mpi", nullptr, pg.rank(), pg.size(), options);
  auto b = createProcessGroup("mpi", nullptr, pg.rank(), pg.size(), options);
  const int p = pg.size();
  std::string errors[2];
  const auto run = [&](ProcessGroup& g, int which) {
    try {
      for (int k = 0; k < 200; ++k) {
        std::vector<float> v(17 + which, static_cast<float>(g.rank() + k));
        g.allreduce(view(v.data(), v.size()))->wait();
        const float want = static_cast<float>(p * (p - 1) / 2 + p * k);
        if (v.back() != want) {
          errors[which] = "group " + std::to_string(which) + " allreduce #" + std::to_string(k) +
                          ": got " + std::to_string(v.back()) + ", expected " +
                          std::to_string(want);
          return;
        }
      }
    } catch (const std::exception& e) {
      errors[which] = e.what();
    }
  };
  std::thread t0([&] { run(*a, 0); });
  std::thread t1([&] { run(*b, 1); });
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Destroying a group runs what was queued first: Works issued and never waited on complete.
TEST(MpiLifecycle, DestructionRunsQueuedOperations) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  auto g = createProcessGroup("mpi", nullptr, world().rank(), world().size(), options);
  std::vector<std::vector<int64_t>> bufs(20, std::vector<int64_t>(100, 1));
  std::vector<std::shared_ptr<Work>> works;
  for (auto& b : bufs) works.push_back(g->allreduce(view(b.data(), b.size())));
  g.reset();
  for (size_t k = 0; k < works.size(); ++k) {
    EXPECT_TRUE(works[k]->isCompleted()) << "allreduce #" << k + 1;
    EXPECT_TRUE(works[k]->isSuccess()) << "allreduce #" << k + 1;
    EXPECT_EQ(bufs[k][99], world().size());
  }
}

// Under a plain mpirun (no MASTER_ADDR), initProcessGroup("mpi") needs no store; with
// file:// it creates one and the group uses it (monitoredBarrier goes through it).
TEST(MpiInit, InitProcessGroupWithAndWithoutAStore) {
  if (launchEnvironment().count("MASTER_ADDR")) GTEST_SKIP() << "MASTER_ADDR is set";
  InitOptions options;
  options.backend = "mpi";
  options.pg.timeout = std::chrono::seconds(60);
  InitResult bare = initProcessGroup(options);
  EXPECT_EQ(bare.store, nullptr);
  EXPECT_EQ(bare.env.launcher, "openmpi");
  ASSERT_NE(bare.pg, nullptr);
  EXPECT_EQ(bare.pg->rank(), world().rank());
  int32_t one = 1;
  bare.pg->allreduce(view(&one, 1))->wait();
  EXPECT_EQ(one, world().size());
  EXPECT_THROW(bare.pg->monitoredBarrier(), InvalidArgumentError);

  std::unique_ptr<testing::TempDir> dir;
  char path[256] = {};
  if (world().rank() == 0) {
    dir = std::make_unique<testing::TempDir>();
    std::snprintf(path, sizeof(path), "%s", dir->file("store").c_str());
  }
  world().broadcast(view(reinterpret_cast<uint8_t*>(path), sizeof(path)))->wait();
  options.initMethod = std::string("file://") + path;
  InitResult withStore = initProcessGroup(options);
  ASSERT_NE(withStore.store, nullptr);
  EXPECT_TRUE(withStore.pg->monitoredBarrier()->wait());
  withStore.pg.reset();
  withStore.store.reset();
  world().barrier()->wait();  // before rank 0 removes the directory
}

}  // namespace
}  // namespace loom::mpi_testing
