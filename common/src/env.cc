#include "loom/common/env.h"

#include <cctype>
#include <charconv>
#include <limits>
#include <optional>

#include "loom/common/error.h"

namespace loom::env {

namespace {

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

[[noreturn]] void invalid(const char* name, std::string_view value, std::string_view expected,
                          std::string_view note) {
  std::string message = detail::str(name, "='", value, "' is not valid; expected ", expected);
  if (!note.empty()) message += detail::str(" (", note, ")");
  throw InvalidArgumentError(message);
}

// The whole of `text` as a base-10 integer; nullopt for anything else (overflow included).
std::optional<long long> wholeInteger(std::string_view text) {
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v, 10);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

}  // namespace

long long parseInteger(const char* name, std::string_view value, long long lo, long long hi,
                       std::string_view note) {
  const std::optional<long long> v = wholeInteger(value);
  if (!v || *v < lo || *v > hi) {
    invalid(name, value, detail::str("an integer in [", lo, ", ", hi, "]"), note);
  }
  return *v;
}

size_t parseBytes(const char* name, std::string_view value, size_t lo, size_t hi,
                  std::string_view note) {
  auto bad = [&]() {
    invalid(name, value,
            detail::str("a byte count in [", lo, ", ", hi,
                        "]: digits with an optional K, M or G suffix (binary; 512K, 4M, 1GiB)"),
            note);
  };
  size_t digits = 0;
  while (digits < value.size() && std::isdigit(static_cast<unsigned char>(value[digits]))) {
    ++digits;
  }
  if (digits == 0) bad();
  unsigned long long count = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + digits, count, 10);
  if (ec != std::errc() || ptr != value.data() + digits) bad();
  std::string_view suffix = value.substr(digits);
  int shift = 0;
  if (!suffix.empty()) {
    switch (std::tolower(static_cast<unsigned char>(suffix[0]))) {
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
        bad();
    }
    suffix.remove_prefix(1);
    if (!suffix.empty() && !equalsIgnoringCase(suffix, "b") && !equalsIgnoringCase(suffix, "ib")) {
      bad();
    }
  }
  if (count > (std::numeric_limits<unsigned long long>::max() >> shift)) bad();
  const unsigned long long v = count << shift;
  if (v < lo || v > hi) bad();
  return static_cast<size_t>(v);
}

bool parseFlag(const char* name, std::string_view value) {
  for (std::string_view on : {"1", "on", "true", "yes"}) {
    if (equalsIgnoringCase(value, on)) return true;
  }
  for (std::string_view off : {"0", "off", "false", "no"}) {
    if (equalsIgnoringCase(value, off)) return false;
  }
  invalid(name, value, "1/0, on/off, true/false or yes/no (any case)", {});
}

std::string parseChoice(const char* name, std::string_view value,
                        std::initializer_list<std::string_view> allowed) {
  std::string list;
  for (std::string_view a : allowed) {
    if (equalsIgnoringCase(value, a)) return std::string(a);
    list += detail::str(list.empty() ? "" : ", ", a);
  }
  invalid(name, value, detail::str("one of: ", list), {});
}

}  // namespace loom::env
