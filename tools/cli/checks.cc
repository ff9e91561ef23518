#include "loom/cli/checks.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>

namespace loom::cli {

namespace {

std::string text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The whole text as an integer; false when it is not one. One past 64 bits is clamped to
// LLONG_MIN or LLONG_MAX (out of every range asked for).
bool parseWhole(const std::string& value, long long& out) {
  if (value.empty() || std::isspace(static_cast<unsigned char>(value.front()))) return false;
  char* end = nullptr;
  out = std::strtoll(value.c_str(), &end, 10);
  return end == value.c_str() + value.size();
}

// The whole text as a finite number; false when it is not one.
bool parseNumber(const std::string& value, double& out) {
  if (value.empty() || std::isspace(static_cast<unsigned char>(value.front()))) return false;
  char* end = nullptr;
  out = std::strtod(value.c_str(), &end);
  return end == value.c_str() + value.size() && std::isfinite(out);
}

// `bounded`: `expected` names hi (else hi is the type's limit, named only when exceeded).
CLI::Validator whole(long long lo, long long hi, bool bounded, const std::string& expected) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        long long v = 0;
        if (!parseWhole(value, v)) {
          return "'" + value + "' is not a whole number; expected " + expected;
        }
        if (v < lo || v > hi) {
          return "'" + value + "' is out of range; expected " +
                 (v > hi && !bounded ? "at most " + std::to_string(hi) : expected);
        }
        return "";
      },
      "INT: " + expected);
}

CLI::Validator number(double lo, double hi, bool open, const std::string& expected) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        double v = 0;
        if (!parseNumber(value, v)) return "'" + value + "' is not a number; expected " + expected;
        if (v < lo || v > hi || (open && v == lo)) {
          return "'" + value + "' is out of range; expected " + expected;
        }
        return "";
      },
      "NUMBER: " + expected);
}

}  // namespace

CLI::Validator wholeIn(long long lo, long long hi) {
  return whole(lo, hi, true, std::to_string(lo) + " to " + std::to_string(hi));
}

CLI::Validator wholeAtLeast(long long lo) {
  return whole(lo, std::numeric_limits<int>::max(), false, "at least " + std::to_string(lo));
}

CLI::Validator numberIn(double lo, double hi) {
  return number(lo, hi, false, text(lo) + " to " + text(hi));
}

CLI::Validator numberAtLeast(double lo) {
  return number(lo, HUGE_VAL, false, "at least " + text(lo));
}

CLI::Validator numberAbove(double lo) {
  return number(lo, HUGE_VAL, true, "more than " + text(lo));
}

int exitFor(const CLI::App& app, const CLI::ParseError& e, const std::string& program) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
    std::cout << app.help();
    return 0;
  }
  std::cerr << program << ": " << e.what() << "\nRun '" << program << " --help' for the flags.\n";
  return 2;
}

}  // namespace loom::cli
