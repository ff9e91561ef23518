// loom::env: the parsers on good values, suffixes, bounds, garbage and empty strings; the error
// text names the variable, quotes the value and says what is accepted. (Reading the
// environment is the settings registry's: settings_test.cc.)
#include "loom/common/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <string>

#include "loom/common/error.h"
#include "loom/testing/errors.h"

namespace loom::env {
namespace {

using ::testing::HasSubstr;

template <typename F>
std::string errorOf(F&& f) {
  return testing::messageOf<InvalidArgumentError>(f);
}

TEST(Env, IntegerAcceptsWholeBase10NumbersInRange) {
  EXPECT_EQ(parseInteger("X", "0", 0, 10), 0);
  EXPECT_EQ(parseInteger("X", "10", 0, 10), 10);
  EXPECT_EQ(parseInteger("X", "-3", -5, 5), -3);
  EXPECT_EQ(parseInteger("X", "007", 0, 10), 7);
  EXPECT_EQ(parseInteger("X", "9223372036854775807", 0, INT64_MAX), INT64_MAX);
}

TEST(Env, IntegerRejectsGarbageBoundsAndEmptyNamingTheVariable) {
  for (const char* bad :
       {"", "abc", "4x", " 4", "4 ", "+4", "1e3", "0x10", "11", "-1", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    const std::string what = errorOf([&] { parseInteger("LOOM_SPIN_US", bad, 0, 10); });
    EXPECT_THAT(what, HasSubstr(std::string("LOOM_SPIN_US='") + bad + "' is not valid"));
    EXPECT_THAT(what, HasSubstr("expected an integer in [0, 10]"));
  }
  EXPECT_THAT(errorOf([] { parseInteger("LOOM_PG_NAP_US", "soon", 0, 1000000, "microseconds"); }),
              HasSubstr("expected an integer in [0, 1000000] (microseconds)"));
}

TEST(Env, BytesAcceptBinarySuffixes) {
  const size_t kMax = size_t{1} << 40;
  EXPECT_EQ(parseBytes("X", "4096", 0, kMax), 4096u);
  EXPECT_EQ(parseBytes("X", "512K", 0, kMax), 512u << 10);
  EXPECT_EQ(parseBytes("X", "512k", 0, kMax), 512u << 10);
  EXPECT_EQ(parseBytes("X", "256KB", 0, kMax), 256u << 10);
  EXPECT_EQ(parseBytes("X", "256KiB", 0, kMax), 256u << 10);
  EXPECT_EQ(parseBytes("X", "4M", 0, kMax), 4u << 20);
  EXPECT_EQ(parseBytes("X", "4mib", 0, kMax), 4u << 20);
  EXPECT_EQ(parseBytes("X", "1G", 0, kMax), size_t{1} << 30);
  EXPECT_EQ(parseBytes("X", "1GiB", 0, kMax), size_t{1} << 30);
  EXPECT_EQ(parseBytes("X", "0", 0, kMax), 0u);
}

TEST(Env, BytesRejectGarbageBoundsAndEmptyNamingTheVariable) {
  for (const char* bad : {"", "4x", "abc", "K", "-4096", "4 K", "4K ", "4KK", "4KB2", "1.5M", "4Bi",
                          "4T", "2K", "2G", "99999999999999999999G"}) {
    SCOPED_TRACE(bad);
    const std::string what =
        errorOf([&] { parseBytes("LOOM_CHUNK_BYTES", bad, 4096, size_t{1} << 30); });
    EXPECT_THAT(what, HasSubstr(std::string("LOOM_CHUNK_BYTES='") + bad + "' is not valid"));
    EXPECT_THAT(what, HasSubstr("expected a byte count in [4096, 1073741824]"));
    EXPECT_THAT(what, HasSubstr("512K, 4M, 1GiB"));
  }
  EXPECT_THAT(errorOf([] { parseBytes("LOOM_TCP_BUFFER_BYTES", "lots", 1, 10, "or 'auto'"); }),
              HasSubstr("(or 'auto')"));
}

TEST(Env, FlagsAcceptTheUsualSpellingsInAnyCase) {
  for (const char* on : {"1", "on", "ON", "true", "True", "yes", "YES"}) {
    EXPECT_TRUE(parseFlag("X", on)) << on;
  }
  for (const char* off : {"0", "off", "OFF", "false", "FALSE", "no", "No"}) {
    EXPECT_FALSE(parseFlag("X", off)) << off;
  }
  for (const char* bad : {"", "of", "disable", "2", "y", " 1"}) {
    SCOPED_TRACE(bad);
    const std::string what = errorOf([&] { parseFlag("LOOM_SHM", bad); });
    EXPECT_THAT(what, HasSubstr(std::string("LOOM_SHM='") + bad + "' is not valid"));
    EXPECT_THAT(what, HasSubstr("1/0, on/off, true/false or yes/no"));
  }
}

TEST(Env, ChoiceMatchesInAnyCaseAndListsTheAllowedValues) {
  EXPECT_EQ(parseChoice("X", "generic", {"auto", "generic"}), "generic");
  EXPECT_EQ(parseChoice("X", "AUTO", {"auto", "generic"}), "auto");
  for (const char* bad : {"", "avx", "generic "}) {
    SCOPED_TRACE(bad);
    const std::string what = errorOf([&] {
      parseChoice("LOOM_REDUCE_ISA", bad, {"auto", "generic"});
    });
    EXPECT_THAT(what, HasSubstr(std::string("LOOM_REDUCE_ISA='") + bad + "' is not valid"));
    EXPECT_THAT(what, HasSubstr("expected one of: auto, generic"));
  }
}

}  // namespace
}  // namespace loom::env
