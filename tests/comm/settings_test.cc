// The one test of comm's environment parsing (every other comm test sets ContextOptions):
// Context::create applies the LOOM_* variables of the settings registry to the options the
// caller left at their defaults, a bad value fails setup naming the variable every time, and an
// option the caller set beats its variable. Plus describeNonDefault.
#include <gtest/gtest.h>

#include <string>

#include "context_settings.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "loom/testing/scoped_env.h"

namespace loom::comm {
namespace {

using loom::testing::ScopedEnv;
using namespace std::chrono_literals;

ContextOptions local() {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 10s;
  return o;
}

void expectContains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// What two same-host thread ranks get for `options`.
std::string summaryOfTwoRanks(const ContextOptions& options) {
  HashStore store;
  std::string summary;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options);
    if (rank == 0) summary = ctx->transportSummary();
  });
  return summary;
}

TEST(Settings, BadVariableFailsEverySetupNamingIt) {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  for (const Case& c : {
           Case{"LOOM_ALGO", "bogus", "auto"},
           Case{"LOOM_CHUNK_BYTES", "abc", "a byte count in [4096, 1073741824]"},
           Case{"LOOM_CHUNK_BYTES", "4x", "512K, 4M, 1GiB"},
           Case{"LOOM_CHUNK_BYTES", "2K", "a byte count in [4096, 1073741824]"},
           Case{"LOOM_REDUCE_ISA", "avx", "auto, generic"},
           Case{"LOOM_TCP_BUSY_US", "-5", "an integer in [0, 10000000]"},
           Case{"LOOM_TCP_BUSY_US", "10ms", "an integer in [0, 10000000]"},
           Case{"LOOM_TCP_SEND_BYTES", "12", "a byte count in [4096, 1073741824]"},
           Case{"LOOM_TCP_BUFFER_BYTES", "lots", "or 'auto'"},
           Case{"LOOM_SPIN_US", "fast", "an integer in [0, 10000000]"},
           Case{"LOOM_SHM", "of", "1/0, on/off, true/false or yes/no"},
           Case{"LOOM_SHM_P2P", "disable", "1/0, on/off, true/false or yes/no"},
           Case{"LOOM_SHM_SLOT_BYTES", "4x", "a byte count in [4096, 1073741824]"},
           Case{"LOOM_SHM_RING_BYTES", "lots", "a byte count in [4096, 1073741824]"},
           Case{"LOOM_SHM_SPIN_US", "abc", "an integer in [0, 10000000]"},
           Case{"LOOM_SHM_YIELD_US", "1ms", "an integer in [0, 10000000]"},
           Case{"LOOM_SHM_MEMFD", "maybe", "1/0, on/off, true/false or yes/no"},
           Case{"LOOM_IB_PORT", "0", "an integer in [1, 255]"},
           Case{"LOOM_IB_SLOTS", "1", "an integer in [2, 4096]"},
       }) {
    SCOPED_TRACE(::testing::Message() << c.name << "=" << c.value);
    ScopedEnv bad(c.name, c.value);
    // Every setup fails, not only the first (nothing bad is cached), and before any connection.
    for (int attempt = 0; attempt < 2; ++attempt) {
      HashStore store;
      try {
        Context::create(store, 0, 1, local());
        ADD_FAILURE() << "no error";
      } catch (const InvalidArgumentError& e) {
        expectContains(e.what(), detail::str(c.name, "='", c.value, "' is not valid"));
        expectContains(e.what(), c.expected);
      }
    }
  }
}

TEST(Settings, ShmOffTurnsSharedMemoryOffForDefaultOptions) {
  {
    ScopedEnv unset("LOOM_SHM", nullptr);
    EXPECT_EQ(summaryOfTwoRanks(local()).rfind("shm", 0), 0u) << summaryOfTwoRanks(local());
  }
  ScopedEnv off("LOOM_SHM", "0");
  EXPECT_EQ(summaryOfTwoRanks(local()), "tcp");
}

TEST(Settings, ExplicitOptionBeatsTheVariable) {
  {
    ScopedEnv on("LOOM_SHM", "1");
    ContextOptions o = local();
    o.sharedMemory = false;
    EXPECT_EQ(summaryOfTwoRanks(o), "tcp");
  }
  ScopedEnv chunk("LOOM_CHUNK_BYTES", "8K");
  ScopedEnv algo("LOOM_ALGO", "Ring");
  ScopedEnv slot("LOOM_SHM_SLOT_BYTES", "64K");
  ScopedEnv port("LOOM_IB_PORT", "2");
  ContextOptions defaults;
  const ContextOptions filled = withEnvironment(defaults);
  EXPECT_EQ(filled.chunkBytes, size_t{8192});
  EXPECT_EQ(filled.algorithm, Algorithm::kRing);
  EXPECT_EQ(filled.shmSlotBytes, size_t{65536});
  EXPECT_EQ(filled.verbs.port, 2);
  ContextOptions mine;
  mine.chunkBytes = 64 << 10;
  mine.algorithm = Algorithm::kDirect;
  mine.shmSlotBytes = 4096;
  mine.verbs.port = 3;
  const ContextOptions kept = withEnvironment(mine);
  EXPECT_EQ(kept.chunkBytes, size_t{64} << 10);
  EXPECT_EQ(kept.algorithm, Algorithm::kDirect);
  EXPECT_EQ(kept.shmSlotBytes, size_t{4096});
  EXPECT_EQ(kept.verbs.port, 3);
}

TEST(Settings, EveryCommVariableFillsItsField) {
  ScopedEnv a("LOOM_ALGO", "shm");  // the automatic choice, arena included
  ScopedEnv b("LOOM_REDUCE_ISA", "generic");
  ScopedEnv c("LOOM_HOST", "127.0.0.1");
  ScopedEnv d("LOOM_TCP_BUSY_US", "0");
  ScopedEnv e("LOOM_TCP_SEND_BYTES", "64K");
  ScopedEnv f("LOOM_TCP_BUFFER_BYTES", "auto");
  ScopedEnv g("LOOM_SPIN_US", "7");
  ScopedEnv h("LOOM_SHM_P2P", "off");
  ScopedEnv i("LOOM_SHM_HOST_ID", "host-a");
  ScopedEnv j("LOOM_SHM_MEMFD", "no");
  ScopedEnv k("LOOM_SHM_RING_BYTES", "8KiB");
  ScopedEnv l("LOOM_SHM_SPIN_US", "0");
  ScopedEnv m("LOOM_SHM_YIELD_US", "5");
  ScopedEnv n("LOOM_IB_DEVICE", "mlx5_1");
  ScopedEnv p("LOOM_IB_GID_INDEX", "3");
  ScopedEnv q("LOOM_IB_SLOTS", "32");
  ScopedEnv r("LOOM_IB_SLOT_BYTES", "4K");
  const ContextOptions o = withEnvironment({});
  EXPECT_EQ(o.algorithm, Algorithm::kAuto);
  EXPECT_EQ(o.reduceIsa, ReduceIsa::kGeneric);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.busyPollUs, 0);
  EXPECT_EQ(o.tcpSendBytes, size_t{65536});
  EXPECT_EQ(o.socketBufferBytes, -1);
  EXPECT_EQ(o.tcpSpinUs, 7);
  EXPECT_FALSE(o.shmPointToPoint);
  EXPECT_EQ(o.shmHostId, "host-a");
  EXPECT_FALSE(o.shmMemfd);
  EXPECT_EQ(o.shmRingBytes, size_t{8192});
  EXPECT_EQ(o.shmSpinUs, 0);
  EXPECT_EQ(o.shmYieldUs, 5);
  EXPECT_EQ(o.verbs.device, "mlx5_1");
  EXPECT_EQ(o.verbs.gidIndex, 3);
  EXPECT_EQ(o.verbs.slots, 32);
  EXPECT_EQ(o.verbs.slotBytes, size_t{4096});
  EXPECT_NO_THROW(validateOptions(o));
}

TEST(Settings, OptionsOutOfRangeFailNamingTheField) {
  ContextOptions o;
  o.chunkBytes = 100;
  try {
    validateOptions(o);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgumentError& e) {
    expectContains(e.what(), "ContextOptions::chunkBytes is 100");
    expectContains(e.what(), "[4096, 1073741824]");
  }
  ContextOptions v;
  v.verbs.port = 0;
  EXPECT_THROW(validateOptions(v), InvalidArgumentError);
}

TEST(Settings, DescribeNonDefault) {
  EXPECT_EQ(describeNonDefault({}), "");
  ContextOptions o;
  o.sharedMemory = false;
  o.chunkBytes = 4096;
  o.algorithm = Algorithm::kRing;
  o.verbs.slots = 8;
  EXPECT_EQ(describeNonDefault(o), "sharedMemory=0 algorithm=ring chunkBytes=4096 verbs.slots=8");
}

}  // namespace
}  // namespace loom::comm
