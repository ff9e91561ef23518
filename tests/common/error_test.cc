#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom {
namespace {

TEST(Error, CheckNamesConditionLocationAndMessage) {
  try {
    const int rank = 3;
    LOOM_CHECK(rank < 2, "rank ", rank, " is out of range for world size ", 2);
    FAIL() << "LOOM_CHECK did not throw";
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("error_test.cc:"), std::string::npos) << what;
    EXPECT_NE(what.find("rank < 2"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 3 is out of range for world size 2"), std::string::npos) << what;
  }
}

TEST(Error, CheckEqPrintsBothValues) {
  try {
    LOOM_CHECK_EQ(3, 4, "counts differ");
    FAIL() << "LOOM_CHECK_EQ did not throw";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("3 == 4 (3 vs 4): counts differ"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(LOOM_CHECK_EQ(4, 4));
}

TEST(Error, CheckTThrowsTheRequestedType) {
  EXPECT_THROW(LOOM_CHECK_T(IoError, false, "peer gone"), IoError);
  EXPECT_THROW(LOOM_THROW(TimeoutError, "late"), IoError);
}

TEST(Error, SyscheckAddsStrerrorAndContext) {
  try {
    LOOM_SYSCHECK(::open("/nonexistent/loom/file", O_RDONLY), "opening the test file");
    FAIL() << "LOOM_SYSCHECK did not throw";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("opening the test file"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  const int fd = LOOM_SYSCHECK(::open("/dev/null", O_RDONLY));
  EXPECT_GE(fd, 0);
  ::close(fd);
}

TEST(Deadline, RemainingNeverNegative) {
  Deadline past(milliseconds(-5));
  EXPECT_TRUE(past.expired());
  EXPECT_EQ(past.remaining().count(), 0);
  Deadline future(milliseconds(60000));
  EXPECT_FALSE(future.expired());
  EXPECT_GT(future.remaining().count(), 59000);
}

TEST(Logging, LevelGatesMessages) {
  const LogLevel saved = logLevel();
  setLogLevel(LogLevel::kError);
  EXPECT_FALSE(logEnabled(LogLevel::kWarning));
  EXPECT_TRUE(logEnabled(LogLevel::kError));
  setLogLevel(LogLevel::kOff);
  EXPECT_FALSE(logEnabled(LogLevel::kError));
  setLogLevel(saved);
}

}  // namespace
}  // namespace loom
