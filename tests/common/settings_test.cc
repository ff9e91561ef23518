// The settings registry: the table is well formed (unique names, defaults valid for their
// kind), docs/env.md is what the table generates, the readers treat unset and empty as unset
// and reject bad values naming the variable, fillDefault keeps a field the caller set, and a
// bad LOOM_LOG_LEVEL is a warning rather than an error (in a forked child: the level is read
// once per process).
#include "loom/common/settings.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <map>

#include <atomic>
#include <cstdlib>
#include <thread>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "loom/common/env.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/testing/errors.h"
#include "loom/testing/scoped_env.h"

namespace loom::settings {
namespace {

using ::testing::HasSubstr;
using testing::ScopedEnv;

template <typename F>
std::string errorOf(F&& f) {
  return testing::messageOf<Error>(f);
}

TEST(Settings, TableNamesAreUniqueAndEveryRowIsComplete) {
  std::set<std::string> names;
  for (const Setting& s : all()) {
    SCOPED_TRACE(s.name);
    EXPECT_TRUE(names.insert(s.name).second) << "declared twice";
    EXPECT_NE(std::string(s.meaning), "");
    EXPECT_NE(std::string(s.readAt), "");
    if (s.kind == Kind::kChoice) {
      EXPECT_NE(std::string(s.choices), "");
    }
    if (s.kind == Kind::kInteger || s.kind == Kind::kBytes) {
      EXPECT_LE(s.min, s.max);
    }
    if (s.section == Section::kRuntime) {
      EXPECT_NE(std::string(s.field), "") << "fills nothing";
    }
  }
}

// A declared default must be a value the variable accepts (the docs show it as one).
TEST(Settings, DeclaredDefaultsAreValidValues) {
  for (const Setting& s : all()) {
    const std::string d = s.defaultValue;
    if (d.empty() || s.kind == Kind::kText) continue;
    SCOPED_TRACE(s.name);
    ScopedEnv scoped(s.name, d.c_str());
    switch (s.kind) {
      case Kind::kInteger:
        if (!word(s.name)) {
          EXPECT_TRUE(integer(s.name).has_value());
        }
        break;
      case Kind::kBytes:
        if (!word(s.name)) {
          EXPECT_TRUE(bytes(s.name).has_value());
        }
        break;
      case Kind::kFlag:
        EXPECT_TRUE(flag(s.name).has_value());
        break;
      case Kind::kChoice:
        EXPECT_TRUE(choice(s.name).has_value());
        break;
      case Kind::kText:
        break;
    }
  }
}

TEST(Settings, DocsEnvMdIsGeneratedFromTheTable) {
  std::ifstream in(LOOM_SOURCE_DIR "/docs/env.md");
  ASSERT_TRUE(in) << "cannot read docs/env.md";
  std::stringstream file;
  file << in.rdbuf();
  EXPECT_TRUE(file.str() == markdown())
      << "docs/env.md differs from the settings table; regenerate it with\n"
         "  build/bin/loom-settings --markdown > docs/env.md";
}

TEST(Settings, ReadersTreatUnsetAndEmptyAsUnset) {
  for (const char* v : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv a("LOOM_CHUNK_BYTES", v), b("LOOM_SHM", v), c("LOOM_PG_NAP_US", v), d("LOOM_ALGO", v),
        e("LOOM_HOST", v);
    EXPECT_FALSE(bytes("LOOM_CHUNK_BYTES"));
    EXPECT_FALSE(flag("LOOM_SHM"));
    EXPECT_FALSE(integer("LOOM_PG_NAP_US"));
    EXPECT_FALSE(choice("LOOM_ALGO"));
    EXPECT_FALSE(text("LOOM_HOST"));
    EXPECT_FALSE(value("LOOM_HOST"));
  }
}

TEST(Settings, ReadersParseByTheDeclaredKindAndRange) {
  ScopedEnv a("LOOM_CHUNK_BYTES", "64K"), b("LOOM_SHM", "off"), c("LOOM_PG_NAP_US", "250"),
      d("LOOM_ALGO", "Ring"), e("LOOM_HOST", "10.0.0.1");
  EXPECT_EQ(bytes("LOOM_CHUNK_BYTES"), 65536u);
  EXPECT_EQ(flag("LOOM_SHM"), false);
  EXPECT_EQ(integer("LOOM_PG_NAP_US"), 250);
  EXPECT_EQ(choice("LOOM_ALGO"), "ring");  // spelled as declared
  EXPECT_EQ(text("LOOM_HOST"), "10.0.0.1");
  EXPECT_THAT(describeSet(), HasSubstr("LOOM_CHUNK_BYTES=64K"));
  EXPECT_THAT(describeSet(), HasSubstr("LOOM_SHM=off"));
}

TEST(Settings, BadValuesNameTheVariableTheValueAndWhatIsAccepted) {
  {
    ScopedEnv a("LOOM_CHUNK_BYTES", "4x");
    const std::string what = errorOf([] { (void)bytes("LOOM_CHUNK_BYTES"); });
    EXPECT_THAT(what, HasSubstr("LOOM_CHUNK_BYTES='4x' is not valid"));
    EXPECT_THAT(what, HasSubstr("[4096, 1073741824]"));
  }
  {
    ScopedEnv a("LOOM_CHUNK_BYTES", "1K");  // below the declared minimum: no silent clamping
    EXPECT_THAT(errorOf([] { (void)bytes("LOOM_CHUNK_BYTES"); }), HasSubstr("is not valid"));
  }
  {
    ScopedEnv a("LOOM_PG_NAP_US", "-1");
    EXPECT_THAT(errorOf([] { (void)integer("LOOM_PG_NAP_US"); }),
                HasSubstr("an integer in [0, 1000000] (µs)"));
  }
  {
    ScopedEnv a("LOOM_ALGO", "fastest");
    const std::string what = errorOf([] { (void)choice("LOOM_ALGO"); });
    EXPECT_THAT(what, HasSubstr("LOOM_ALGO='fastest' is not valid"));
    EXPECT_THAT(what, HasSubstr("ring, rd"));
  }
  {
    ScopedEnv a("LOOM_SHM", "maybe");
    EXPECT_THAT(errorOf([] { (void)flag("LOOM_SHM"); }), HasSubstr("LOOM_SHM='maybe'"));
  }
}

TEST(Settings, ExtraWordsAreReportedApartFromNumbers) {
  {
    ScopedEnv a("LOOM_TCP_BUFFER_BYTES", "AUTO");
    EXPECT_EQ(word("LOOM_TCP_BUFFER_BYTES"), "auto");
    EXPECT_FALSE(bytes("LOOM_TCP_BUFFER_BYTES"));
  }
  {
    ScopedEnv a("LOOM_TCP_BUFFER_BYTES", "4M");
    EXPECT_FALSE(word("LOOM_TCP_BUFFER_BYTES"));
    EXPECT_EQ(bytes("LOOM_TCP_BUFFER_BYTES"), 4u << 20);
  }
  {
    ScopedEnv a("LOOM_TCP_BUFFER_BYTES", "big");
    EXPECT_THAT(errorOf([] { (void)bytes("LOOM_TCP_BUFFER_BYTES"); }), HasSubstr("or 'auto'"));
  }
}

TEST(Settings, UndeclaredOrMistypedReadsAreProgrammingErrors) {
  EXPECT_THAT(errorOf([] { (void)integer("LOOM_NO_SUCH_KNOB"); }),
              HasSubstr("not declared in the settings registry"));
  EXPECT_THAT(errorOf([] { (void)flag("LOOM_CHUNK_BYTES"); }), HasSubstr("another kind"));
}

// A LOOM_* name no library reads is found; one within two edits of a declared name is named
// with it (a typo silently left the setting it meant out of force).
TEST(Settings, UnknownLoomVariablesAreFoundAndLikelyTyposNamed) {
  // Set directly: ScopedEnv refuses undeclared names.
  struct RawEnv {
    const char* name;
    RawEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~RawEnv() { ::unsetenv(name); }
  };
  RawEnv typo("LOOM_TCP_SOCKET", "4");
  RawEnv script("LOOM_SOMETHING_ELSE_ENTIRELY", "1");
  ScopedEnv known("LOOM_SHM", "0");
  std::map<std::string, std::string> found;
  for (const auto& u : unknownLoomVariables()) {
    found[u.name] = u.didYouMean;
    if (u.name == "LOOM_TCP_SOCKET") {
      EXPECT_EQ(u.value, "4");
    }
  }
  ASSERT_EQ(found.count("LOOM_TCP_SOCKET"), 1u);
  EXPECT_EQ(found["LOOM_TCP_SOCKET"], "LOOM_TCP_SOCKETS");
  ASSERT_EQ(found.count("LOOM_SOMETHING_ELSE_ENTIRELY"), 1u);
  EXPECT_EQ(found["LOOM_SOMETHING_ELSE_ENTIRELY"], "");
  EXPECT_EQ(found.count("LOOM_SHM"), 0u);
}

TEST(Settings, FillDefaultKeepsAFieldTheCallerSet) {
  const size_t kDefault = 512 * 1024;
  size_t left = kDefault, set = 4096;
  fillDefault(left, kDefault, std::optional<size_t>(65536));
  fillDefault(set, kDefault, std::optional<size_t>(65536));
  EXPECT_EQ(left, 65536u);
  EXPECT_EQ(set, 4096u);
  bool shm = true;
  fillDefault(shm, true, std::optional<bool>());  // unset: unchanged
  EXPECT_TRUE(shm);
  fillDefault(shm, true, std::optional<bool>(false));
  EXPECT_FALSE(shm);
}

TEST(Settings, SnapshotTakesTheSetVariablesOfOneSection) {
  ScopedEnv a("RANK", "3"), b("WORLD_SIZE", "4"), c("MASTER_ADDR", ""), d("LOOM_SHM", "0");
  const auto launch = snapshot(Section::kLaunch);
  EXPECT_EQ(launch.at("RANK"), "3");
  EXPECT_EQ(launch.at("WORLD_SIZE"), "4");
  EXPECT_EQ(launch.count("MASTER_ADDR"), 0u);  // empty is unset
  EXPECT_EQ(launch.count("LOOM_SHM"), 0u);     // another section
}

TEST(Settings, TheStoreTokenIsNeverLogged) {
  ScopedEnv a("LOOM_STORE_TOKEN", "hunter2");
  EXPECT_THAT(describeSet(), HasSubstr("LOOM_STORE_TOKEN=(set)"));
  EXPECT_THAT(describeSet(), ::testing::Not(HasSubstr("hunter2")));
}

// The child half of the next test: runs in a fresh process (the level is read once per
// process, and earlier tests here may have logged already).
TEST(Settings, DISABLED_LogLevelChild) {
  EXPECT_FALSE(logEnabled(LogLevel::kInfo));
  EXPECT_TRUE(logEnabled(LogLevel::kWarning));
  LOOM_LOG_WARNING("still logging");
}

// A bad LOOM_LOG_LEVEL must not take logging down: one warning naming the variable, the value
// and the accepted levels, then the warning level.
TEST(Settings, BadLogLevelIsAWarningAndMeansWarning) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::setenv("LOOM_LOG_LEVEL", "verbose", 1);
    ::execl("/proc/self/exe", "common_test", "--gtest_also_run_disabled_tests",
            "--gtest_filter=Settings.DISABLED_LogLevelChild", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) err.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  EXPECT_THAT(err, HasSubstr("LOOM_LOG_LEVEL='verbose' is not valid"));
  EXPECT_THAT(err, HasSubstr("debug, info, warning"));
  EXPECT_THAT(err, HasSubstr("still logging"));
}

// A thread may still log while its process exits (a detached thread of the flight recorder,
// when the store host exited first): logging must survive the static destructors. Each child
// starts a thread that logs without pause and returns from exit() under it; 20 children, each
// must exit 0 (the logger destroyed at exit made them die of SIGSEGV).
TEST(Logging, AThreadThatLogsWhileTheProcessExitsDoesNotCrashIt) {
  for (int child = 0; child < 20; ++child) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);
      std::atomic<int> logged{0};
      std::thread([&logged] {
        for (;;) {
          LOOM_LOG_WARNING("logging while the process exits");
          logged.fetch_add(1, std::memory_order_relaxed);
        }
      }).detach();
      while (logged.load(std::memory_order_relaxed) < 100) std::this_thread::yield();
      std::exit(0);  // static destructors run while the thread logs
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << child << " "
        << (WIFSIGNALED(status) ? "died of signal " + std::to_string(WTERMSIG(status))
                                : "exited " + std::to_string(WEXITSTATUS(status)));
  }
}

}  // namespace
}  // namespace loom::settings
