#include "loom/common/error.h"

#include <cstring>

namespace loom::detail {

std::string location(const char* file, int line) {
  std::string_view path(file);
  const auto slash = path.find_last_of('/');
  if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
  return str("[", path, ":", line, "] ");
}

std::string errnoText(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return str(text, " (errno ", err, ")");
}

}  // namespace loom::detail
