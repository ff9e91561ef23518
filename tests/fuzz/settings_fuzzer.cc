// libFuzzer target: settings values (common/src/settings.cc, env.cc). The first byte picks a
// declared variable of the registry (so every kind is reached: integer, bytes, flag, choice,
// text), the rest is its value, set in this process's environment and read through the
// registry's reader of that kind, as an entry point reads it.
//
// Properties:
// - a value is either accepted or rejected with InvalidArgumentError naming the variable;
//   nothing else is thrown;
// - an accepted number lies in the declared range, and agrees with an independent parse of the
//   documented grammar (base-10 integers with an optional '-'; byte counts: digits with an
//   optional K/M/G suffix, optionally followed by B or iB, any case) -- what the grammar accepts
//   within the range is accepted, and nothing else;
// - what was read, written back in its plain form (digits, 1/0, the choice as declared), reads
//   back to the same value; a choice matches in any case; text comes back unchanged.
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loom/common/env.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace {

namespace settings = loom::settings;
using loom::InvalidArgumentError;

// The documented grammar, parsed independently: nullopt when `v` is not of the form, else its
// value (saturating at 2^127: beyond any range).
std::optional<__int128> oracleInteger(const std::string& v) {
  size_t i = 0;
  const bool negative = !v.empty() && v[0] == '-';
  if (negative) ++i;
  if (i == v.size()) return std::nullopt;
  __int128 value = 0;
  for (; i < v.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(v[i]))) return std::nullopt;
    if (value < (__int128{1} << 100)) value = value * 10 + (v[i] - '0');
  }
  return negative ? -value : value;
}

std::optional<__int128> oracleBytes(const std::string& v) {
  size_t i = 0;
  __int128 value = 0;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) {
    if (value < (__int128{1} << 100)) value = value * 10 + (v[i] - '0');
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string suffix;
  for (size_t k = i; k < v.size(); ++k) suffix += static_cast<char>(std::tolower(v[k]));
  if (suffix.empty()) return value;
  int shift = 0;
  switch (suffix[0]) {
    case 'k':
      shift = 10;
      break;
    case 'm':
      shift = 20;
      break;
    case 'g':
      shift = 30;
      break;
    default:
      return std::nullopt;
  }
  const std::string rest = suffix.substr(1);
  if (!rest.empty() && rest != "b" && rest != "ib") return std::nullopt;
  return value << shift;
}

bool isWord(const settings::Setting& s, const std::string& v) {
  std::string list = s.choices;
  size_t at = 0;
  while (!list.empty()) {
    const size_t bar = list.find('|', at);
    const std::string w = list.substr(at, bar == std::string::npos ? bar : bar - at);
    if (w.size() == v.size()) {
      bool same = true;
      for (size_t k = 0; k < w.size(); ++k) {
        same = same && std::tolower(static_cast<unsigned char>(w[k])) ==
                           std::tolower(static_cast<unsigned char>(v[k]));
      }
      if (same) return true;
    }
    if (bar == std::string::npos) break;
    at = bar + 1;
  }
  return false;
}

// Sets NAME=value through one buffer per variable handed to putenv (setenv would leak a copy
// of every value set, which a long fuzzing run notices as memory growth).
void setVariable(const char* name, const std::string& value) {
  static std::map<std::string, std::vector<char>> buffers;
  std::vector<char>& b = buffers[name];
  const std::string entry = std::string(name) + "=" + value;
  if (b.size() < entry.size() + 1) {
    ::unsetenv(name);  // the old buffer may be in the environment still
    b.assign(entry.size() + 4096, '\0');
  }
  std::memcpy(b.data(), entry.c_str(), entry.size() + 1);
  ::putenv(b.data());
}

// Reads `s` with `value` set; nullopt-or-value as `read` returns it, or the rejection.
template <class T, class F>
std::optional<T> readWith(const settings::Setting& s, const std::string& value, F read,
                          bool& rejected) {
  setVariable(s.name, value);
  rejected = false;
  try {
    return read(s.name);
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    LOOM_FUZZ_CHECK(what.find(s.name) != std::string::npos, "%s: error does not name it: %s",
                    s.name, e.what());
    rejected = true;
    return std::nullopt;
  } catch (const std::exception& e) {
    LOOM_FUZZ_CHECK(false, "%s='%s': undocumented exception: %s", s.name, value.c_str(), e.what());
  }
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto table = settings::all();
  if (size == 0 || table.empty()) return 0;
  const settings::Setting& s = table[data[0] % table.size()];
  // The environment holds C strings: the value ends at the first NUL.
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  value = value.c_str();
  bool rejected = false;
  const bool unset = value.empty();
  const std::optional<std::string> before = settings::value(s.name);  // restored at the end

  switch (s.kind) {
    case settings::Kind::kInteger: {
      const auto r = readWith<long long>(
          s, value, [](const char* n) { return settings::integer(n); }, rejected);
      const bool word = !unset && isWord(s, value);
      if (unset || word) {
        LOOM_FUZZ_CHECK(!r && !rejected, "%s='%s' is not a number but was read", s.name,
                        value.c_str());
        if (word) LOOM_FUZZ_CHECK(settings::word(s.name).has_value(), "%s: word lost", s.name);
        break;
      }
      const auto expect = oracleInteger(value);
      const bool inRange = expect && *expect >= s.min && *expect <= s.max;
      LOOM_FUZZ_CHECK(inRange == !rejected, "%s='%s': accepted=%d, the grammar says %d", s.name,
                      value.c_str(), int(!rejected), int(inRange));
      if (rejected) break;
      LOOM_FUZZ_CHECK(r && *r == *expect, "%s='%s': read %lld", s.name, value.c_str(), *r);
      const auto again = readWith<long long>(
          s, std::to_string(*r), [](const char* n) { return settings::integer(n); }, rejected);
      LOOM_FUZZ_CHECK(again == r, "%s: %lld does not read back", s.name, *r);
      break;
    }
    case settings::Kind::kBytes: {
      const auto r = readWith<size_t>(
          s, value, [](const char* n) { return settings::bytes(n); }, rejected);
      const bool word = !unset && isWord(s, value);
      if (unset || word) {
        LOOM_FUZZ_CHECK(!r && !rejected, "%s='%s' is not a byte count but was read", s.name,
                        value.c_str());
        break;
      }
      const auto expect = oracleBytes(value);
      const bool inRange = expect && *expect >= s.min && *expect <= s.max;
      LOOM_FUZZ_CHECK(inRange == !rejected, "%s='%s': accepted=%d, the grammar says %d", s.name,
                      value.c_str(), int(!rejected), int(inRange));
      if (rejected) break;
      LOOM_FUZZ_CHECK(r && static_cast<__int128>(*r) == *expect, "%s='%s': read %zu", s.name,
                      value.c_str(), *r);
      const auto again = readWith<size_t>(
          s, std::to_string(*r), [](const char* n) { return settings::bytes(n); }, rejected);
      LOOM_FUZZ_CHECK(again == r, "%s: %zu does not read back", s.name, *r);
      break;
    }
    case settings::Kind::kFlag: {
      const auto r = readWith<bool>(
          s, value, [](const char* n) { return settings::flag(n); }, rejected);
      if (unset) {
        LOOM_FUZZ_CHECK(!r && !rejected, "%s: unset but read", s.name);
        break;
      }
      if (rejected) break;
      LOOM_FUZZ_CHECK(r.has_value(), "%s: neither read nor rejected", s.name);
      const auto again = readWith<bool>(
          s, *r ? "1" : "0", [](const char* n) { return settings::flag(n); }, rejected);
      LOOM_FUZZ_CHECK(again == r, "%s: flag does not read back", s.name);
      break;
    }
    case settings::Kind::kChoice: {
      const auto r = readWith<std::string>(
          s, value, [](const char* n) { return settings::choice(n); }, rejected);
      if (unset) {
        LOOM_FUZZ_CHECK(!r && !rejected, "%s: unset but read", s.name);
        break;
      }
      LOOM_FUZZ_CHECK(isWord(s, value) == !rejected, "%s='%s': accepted=%d", s.name, value.c_str(),
                      int(!rejected));
      if (rejected) break;
      LOOM_FUZZ_CHECK(r && isWord(s, *r) && r->size() == value.size(), "%s: read '%s'", s.name,
                      r ? r->c_str() : "(none)");
      std::string upper = value;
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      const auto again = readWith<std::string>(
          s, upper, [](const char* n) { return settings::choice(n); }, rejected);
      LOOM_FUZZ_CHECK(again == r, "%s: '%s' reads otherwise than '%s'", s.name, upper.c_str(),
                      value.c_str());
      break;
    }
    case settings::Kind::kText: {
      const auto r = readWith<std::string>(
          s, value, [](const char* n) { return settings::text(n); }, rejected);
      LOOM_FUZZ_CHECK(!rejected, "%s: text rejected", s.name);
      LOOM_FUZZ_CHECK(unset ? !r : (r && *r == value), "%s: text changed", s.name);
      break;
    }
  }
  // Raw access and the description of what is set never throw for a declared variable.
  (void)settings::value(s.name);
  (void)settings::describeSet();
  if (before) {
    setVariable(s.name, *before);
  } else {
    ::unsetenv(s.name);
  }
  return 0;
}
