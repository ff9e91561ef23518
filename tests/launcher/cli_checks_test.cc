// The numeric flag checks every Loom program shares (tools/cli): what was given and what is
// expected, a value that is not a number named as such, and the usage-error status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/cli/checks.h"

namespace loom::cli {
namespace {

using ::testing::HasSubstr;

// Parses `value` into a flag checked by `check`: "" when accepted, else CLI11's message.
template <typename T>
std::string parse(CLI::Validator check, const std::string& value, T& out) {
  CLI::App app{"test", "prog"};
  app.add_option("--flag", out)->check(check);
  std::vector<std::string> args = {value, "--flag"};  // CLI11 reads them back to front
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliChecks, WholeNumbersSayWhatWasGivenAndWhatIsExpected) {
  int v = 0;
  EXPECT_EQ(parse(wholeIn(1, 4096), "16", v), "");
  EXPECT_EQ(v, 16);
  EXPECT_EQ(parse(wholeIn(1, 4096), "x", v),
            "--flag: 'x' is not a whole number; expected 1 to 4096");
  EXPECT_EQ(parse(wholeIn(1, 4096), "2.5", v),
            "--flag: '2.5' is not a whole number; expected 1 to 4096");
  EXPECT_EQ(parse(wholeIn(1, 4096), "0", v), "--flag: '0' is out of range; expected 1 to 4096");
  EXPECT_EQ(parse(wholeIn(1, 4096), "4097", v),
            "--flag: '4097' is out of range; expected 1 to 4096");
  EXPECT_THAT(parse(wholeIn(1, 4096), " 5", v), HasSubstr("not a whole number"));
  EXPECT_THAT(parse(wholeIn(1, 4096), "", v), HasSubstr("not a whole number"));
  EXPECT_EQ(parse(wholeAtLeast(0), "0", v), "");
  EXPECT_EQ(parse(wholeAtLeast(1), "-3", v), "--flag: '-3' is out of range; expected at least 1");
  // Past what an int holds: named, not wrapped (CLI11 said only "Could not convert").
  EXPECT_EQ(parse(wholeAtLeast(1), "99999999999", v),
            "--flag: '99999999999' is out of range; expected at most 2147483647");
  EXPECT_EQ(parse(wholeAtLeast(1), "99999999999999999999999", v),
            "--flag: '99999999999999999999999' is out of range; expected at most 2147483647");
  EXPECT_EQ(parse(wholeIn(0, 65535), "-99999999999999999999999", v),
            "--flag: '-99999999999999999999999' is out of range; expected 0 to 65535");
}

TEST(CliChecks, NumbersSayWhatWasGivenAndWhatIsExpected) {
  double v = 0;
  EXPECT_EQ(parse(numberIn(0, 3600), "0.25", v), "");
  EXPECT_EQ(v, 0.25);
  EXPECT_EQ(parse(numberIn(0, 3600), "abc", v),
            "--flag: 'abc' is not a number; expected 0 to 3600");
  EXPECT_EQ(parse(numberIn(0.1, 86400), "0.05", v),
            "--flag: '0.05' is out of range; expected 0.1 to 86400");
  EXPECT_THAT(parse(numberIn(0, 3600), "nan", v), HasSubstr("is not a number"));
  EXPECT_THAT(parse(numberIn(0, 3600), "inf", v), HasSubstr("is not a number"));
  EXPECT_THAT(parse(numberIn(0, 3600), "1e300", v), HasSubstr("is out of range"));
  EXPECT_EQ(parse(numberAtLeast(0), "0", v), "");
  EXPECT_EQ(parse(numberAtLeast(0), "-1", v), "--flag: '-1' is out of range; expected at least 0");
  EXPECT_EQ(parse(numberAbove(0), "1e-9", v), "");
  EXPECT_EQ(parse(numberAbove(0), "0", v), "--flag: '0' is out of range; expected more than 0");
}

TEST(CliChecks, HelpGivesZeroAndAUsageErrorTwoNamingTheProgram) {
  CLI::App app{"what it does", "prog"};
  int n = 1;
  app.add_option("-n,--iters", n, "iterations")->check(wholeAtLeast(1));
  std::vector<std::string> bad = {"0", "-n"};
  ::testing::internal::CaptureStderr();
  int code = -1;
  try {
    app.parse(bad);
  } catch (const CLI::ParseError& e) {
    code = exitFor(app, e, "prog");
  }
  EXPECT_EQ(code, 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "prog: --iters: '0' is out of range; expected at least 1\n"
            "Run 'prog --help' for the flags.\n");
  std::vector<std::string> help = {"--help"};
  ::testing::internal::CaptureStdout();
  try {
    app.parse(help);
  } catch (const CLI::ParseError& e) {
    code = exitFor(app, e, "prog");
  }
  EXPECT_EQ(code, 0);
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), HasSubstr("what it does"));
}

}  // namespace
}  // namespace loom::cli
