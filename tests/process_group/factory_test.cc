// createProcessGroup / isAvailable, the environment into the options (pg_settings.h), and the
// NCCL pieces that run without a device.
#include "loom/process_group/factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/init.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "loom/testing/scoped_env.h"
#include "pg_settings.h"

#ifdef LOOM_HAVE_NCCL
#include "nccl/nccl_backend.h"
#endif

namespace loom {
namespace {

using ::testing::HasSubstr;

template <typename E, typename Fn>
std::string messageOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(Factory, KnowsItsBackends) {
  EXPECT_EQ(backendNames(), (std::vector<std::string>{"tcp", "nccl", "verbs", "mpi"}));
  EXPECT_TRUE(isAvailable("tcp"));
  EXPECT_FALSE(isAvailable("gloo"));
}

TEST(Factory, UnknownBackendListsTheValidOnes) {
  auto store = std::make_shared<HashStore>();
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("gloo", store, 0, 1); }),
              HasSubstr("unknown backend \"gloo\"; expected one of: tcp, nccl, verbs"));
}

TEST(Factory, VerbsWithoutADeviceSaysWhy) {
  if (isAvailable("verbs")) GTEST_SKIP() << "an RDMA device is present (tests/verbs covers it)";
  auto store = std::make_shared<HashStore>();
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createProcessGroup("verbs", store, 0, 1); }),
              HasSubstr("createProcessGroup(\"verbs\"): "));
}

TEST(Factory, CheckAvailableThrowsWhatCreateWould) {
  EXPECT_NO_THROW(checkAvailable("tcp"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { checkAvailable("gloo"); }),
              HasSubstr("unknown backend \"gloo\""));
  if (!isAvailable("verbs")) {
    EXPECT_THROW(checkAvailable("verbs"), NotAvailableError);
  }
  if (!isAvailable("nccl")) {
    EXPECT_THROW(checkAvailable("nccl"), NotAvailableError);
  }
}

// Rank 1 of a job whose backend is missing here fails at once, before its store: it never
// waits for rank 0's store server (which, failing alike, never comes up). The store address
// below has nobody listening; reaching it would take the whole 60 s timeout.
TEST(Factory, InitWithAnUnavailableBackendFailsBeforeTheRendezvous) {
  std::string backend;
  if (!isAvailable("verbs")) backend = "verbs";
  if (!isAvailable("nccl")) backend = "nccl";
  if (backend.empty()) GTEST_SKIP() << "both nccl and verbs are available here";
  InitOptions options;
  options.backend = backend;
  options.initMethod = "tcp://127.0.0.1:9";  // discard port: no store there
  options.rank = 1;
  options.worldSize = 2;
  options.pg.timeout = std::chrono::seconds(60);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(initProcessGroup(options), NotAvailableError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(Factory, RankAndSizeAreChecked) {
  auto store = std::make_shared<HashStore>();
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("tcp", store, 2, 2); }),
              HasSubstr("rank 2 is out of range for world size 2"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("tcp", store, 0, 0); }),
              HasSubstr("world size must be at least 1, got 0"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("tcp", nullptr, 0, 1); }),
              HasSubstr("the store is null"));
}

TEST(Factory, FlightRecorderPreciseEveryIsChecked) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.flightRecorderPreciseEvery = 0;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("tcp", store, 0, 1, o); }),
              HasSubstr("flightRecorderPreciseEvery must be at least 1, got 0"));
}

// The one place process_group reads the environment: createProcessGroup fills the fields left
// at their defaults; a bad value fails the creation naming it. (The other tests set options.)
TEST(Factory, ReadsTheEnvironmentIntoDefaultOptionsOnly) {
  using testing::ScopedEnv;
  auto store = std::make_shared<HashStore>();
  {
    ScopedEnv debug("LOOM_DEBUG", "bogus");
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] { createProcessGroup("tcp", store, 0, 1); }),
                HasSubstr("LOOM_DEBUG='bogus' is not valid"));
  }
  ScopedEnv nap("LOOM_PG_NAP_US", "0");
  ScopedEnv debug("LOOM_DEBUG", "detail");
  ScopedEnv localRank("LOCAL_RANK", "3");
  {
    auto pg = createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1);
    EXPECT_EQ(pg->options().comm.napUs, 0);
    EXPECT_EQ(pg->options().comm.graceUs, CommBackendOptions{}.graceUs);
    EXPECT_EQ(pg->debugLevel(), DebugLevel::kDetail);
    EXPECT_EQ(pg->options().nccl.localRank, 3);
  }
  ProcessGroupOptions mine;
  mine.comm.napUs = 7;
  mine.debug = DebugLevel::kOff;
  mine.nccl.localRank = 0;  // set (the default is -1): LOCAL_RANK=3 does not replace it
  const ProcessGroupOptions filled = withEnvironment(mine);
  EXPECT_EQ(filled.comm.napUs, 7);
  EXPECT_EQ(filled.debug, DebugLevel::kOff);
  EXPECT_EQ(filled.nccl.localRank, 0);
}

// ProcessGroup::reproducible() is what the group's comm::Context decided when it was created:
// ContextOptions::reproducible, else LOOM_REPRODUCIBLE; off by default. In that mode the group
// refuses PROD over a floating dtype at issue.
TEST(Factory, ReproducibleIsTheContextsDecision) {
  using testing::ScopedEnv;
  {
    ScopedEnv unset("LOOM_REPRODUCIBLE", nullptr);
    EXPECT_FALSE(createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1)->reproducible());
    ProcessGroupOptions o;
    o.comm.context.reproducible = true;
    auto pg = createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1, o);
    EXPECT_TRUE(pg->reproducible());
    float x = 2;
    AllreduceOptions prod;
    prod.reduceOp = ReduceOp::kProd;
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg->allreduce(BufferView{&x, 1, DType::kFloat32}, prod);
                }),
                HasSubstr("cannot be made reproducible"));
  }
  {
    ScopedEnv on("LOOM_REPRODUCIBLE", "1");
    EXPECT_TRUE(createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1)->reproducible());
  }
  ScopedEnv off("LOOM_REPRODUCIBLE", "0");
  EXPECT_FALSE(createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1)->reproducible());
}

// A fork() child that issues on its parent's group gets an error naming both processes, not
// a lock a parent thread held at the fork (the comm backend's worker naps holding its queue's
// lock): it used to wait for good, with no deadline.
TEST(Factory, AForkChildThatUsesItsParentsGroupIsToldSo) {
  auto pg = createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1);
  float x = 1;
  pg->allreduce(BufferView{&x, 1, DType::kFloat32})->wait();
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 1;
    try {
      pg->allreduce(BufferView{&x, 1, DType::kFloat32});
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      code = what.find("is a child it made with fork()") != std::string::npos &&
                     what.find(std::to_string(::getppid())) != std::string::npos
                 ? 0
                 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  pid_t reaped = 0;
  for (int i = 0; i < 2000 && reaped == 0; ++i) {  // 20 s: the old code waited for good
    reaped = ::waitpid(child, &status, WNOHANG);
    if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (reaped == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the child's allreduce on its parent's group did not return in 20 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the child's call went through; 2: another message";
  pg->allreduce(BufferView{&x, 1, DType::kFloat32})->wait();  // the parent's group is unharmed
}

// The nccl and mpi backends have no reproducible mode: asking for it there (the option or
// LOOM_REPRODUCIBLE=1) is refused at creation, naming where the request came from, before any
// device or MPI is touched; with it off they are created as before (not here: no device, no
// mpirun).
TEST(Factory, ReproducibleIsRefusedWhereTheBackendHasNone) {
  using testing::ScopedEnv;
  for (const char* backend : {"nccl", "mpi"}) {
    {
      ScopedEnv unset("LOOM_REPRODUCIBLE", nullptr);
      ProcessGroupOptions o;
      o.comm.context.reproducible = true;
      const std::string message = messageOf<InvalidArgumentError>(
          [&] { createProcessGroup(backend, std::make_shared<HashStore>(), 0, 1, o); });
      EXPECT_THAT(message, HasSubstr("ContextOptions::reproducible")) << backend;
      EXPECT_THAT(message, HasSubstr(std::string("the ") + backend + " backend has none"));
    }
    ScopedEnv on("LOOM_REPRODUCIBLE", "1");
    EXPECT_THAT(messageOf<InvalidArgumentError>(
                    [&] { createProcessGroup(backend, std::make_shared<HashStore>(), 0, 1); }),
                HasSubstr("LOOM_REPRODUCIBLE=1"))
        << backend;
  }
}

TEST(Factory, DescribesTheOptionsThatDifferFromTheirDefaults) {
  EXPECT_EQ(describeNonDefault({}), "");
  ProcessGroupOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  o.debug = DebugLevel::kInfo;
  o.comm.napUs = 0;
  o.comm.context.algorithm = comm::Algorithm::kRing;
  o.comm.context.sharedMemory = false;
  o.nccl.device = 1;
  EXPECT_EQ(describeNonDefault(o),
            "timeout=1500ms debug=INFO comm.napUs=0 comm.context.sharedMemory=0 "
            "comm.context.algorithm=ring nccl.device=1");
}

#ifdef LOOM_HAVE_NCCL

TEST(Nccl, WithoutADeviceTheBackendIsNotAvailable) {
  if (ncclDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present (covered by pg_nccl_test)";
  EXPECT_FALSE(isAvailable("nccl"));
  auto store = std::make_shared<HashStore>();
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createProcessGroup("nccl", store, 0, 2); }),
              AllOf(HasSubstr("no CUDA device is usable by this process ("),
                    HasSubstr("cudaGetDeviceCount")));  // CUDA's own reason, not just "none"
  // Nothing was written to the store: a device-less job fails alike on every rank.
  EXPECT_EQ(store->numKeys(), 0);
}

// The backend's other pieces without a device: tests/process_group/nccl_fake_test.cc.

#else

TEST(Nccl, BuiltWithoutNcclSaysSo) {
  auto store = std::make_shared<HashStore>();
  EXPECT_FALSE(isAvailable("nccl"));
  EXPECT_THAT(messageOf<NotAvailableError>([&] { createProcessGroup("nccl", store, 0, 1); }),
              HasSubstr("built without NCCL (LOOM_WITH_NCCL=OFF)"));
}

#endif

}  // namespace
}  // namespace loom
