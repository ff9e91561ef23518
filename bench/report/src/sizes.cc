#include "loom/bench/sizes.h"

#include <charconv>
#include <limits>

#include "loom/common/error.h"

namespace loom::bench {

size_t parseSize(std::string_view text) {
  std::string_view rest = text;
  if (!rest.empty() && (rest.back() == 'B' || rest.back() == 'b')) rest.remove_suffix(1);
  size_t multiplier = 1;
  if (!rest.empty()) {
    switch (rest.back()) {
      case 'K':
      case 'k':
        multiplier = size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        multiplier = size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        multiplier = size_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) rest.remove_suffix(1);
  }
  size_t value = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (rest.empty() || ec != std::errc() || end != rest.data() + rest.size()) {
    LOOM_THROW(InvalidArgumentError, "invalid size '", text,
               "': expected a whole number of bytes with an optional K, M or G suffix "
               "(powers of 1024), e.g. 8, 64K, 16M, 1G");
  }
  if (value > std::numeric_limits<size_t>::max() / multiplier) {
    LOOM_THROW(InvalidArgumentError, "size '", text, "' is too large");
  }
  return value * multiplier;
}

std::vector<size_t> sweepSizes(size_t minBytes, size_t maxBytes, size_t factor) {
  if (minBytes == 0) {
    LOOM_THROW(InvalidArgumentError, "minimum size must be at least 1 byte, got 0");
  }
  if (minBytes > maxBytes) {
    LOOM_THROW(InvalidArgumentError, "minimum size ", minBytes, " is larger than maximum size ",
               maxBytes);
  }
  if (factor < 2) {
    LOOM_THROW(InvalidArgumentError, "step factor must be at least 2, got ", factor);
  }
  std::vector<size_t> sizes;
  for (size_t size = minBytes;; size *= factor) {
    sizes.push_back(size);
    if (size > maxBytes / factor) break;  // the next step would pass max (or overflow)
  }
  return sizes;
}

std::string formatSize(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  size_t value = bytes;
  while (unit < 4 && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return std::to_string(value) + " " + kUnits[unit];
}

}  // namespace loom::bench
