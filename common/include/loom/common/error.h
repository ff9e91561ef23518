// Loom's error types and always-on checks.
//
// Contract: the C++ API reports failures with exceptions derived from loom::Error.
//   InvalidArgumentError  the caller's mistake (wrong rank, size, dtype, ...).
//   IoError               a peer, the network or the file system failed. A group or transport
//                         that raised it is unusable: destroy it and create a new one.
//   TimeoutError          an IoError raised because a deadline passed.
//   NotAvailableError     a backend compiled out, or no device at run time.
// Messages name what failed: rank, peer, operation, sequence number, bytes and timeout.
//
// LOOM_CHECK(cond, args...) throws InvalidArgumentError (or the type given with
// LOOM_CHECK_T) with "[file:line] cond: args..." where args are streamed with operator<<.
// LOOM_SYSCHECK(expr, what...) evaluates a POSIX call, retries on EINTR, and throws IoError
// with strerror(errno) when the call returns -1.
#pragma once

#include <cerrno>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

class IoError : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public IoError {
 public:
  using IoError::IoError;
};

class NotAvailableError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Streams every argument into one string: str("rank ", 2, ": ", what).
template <typename... Args>
std::string str(Args&&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else {
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    return out.str();
  }
}

// "[file:line] " with the file name stripped of its directories.
std::string location(const char* file, int line);

// strerror_r wrapper that always returns the message text.
std::string errnoText(int err);

template <typename E, typename... Args>
[[noreturn]] void throwAt(const char* file, int line, Args&&... args) {
  throw E(location(file, line) + str(std::forward<Args>(args)...));
}

}  // namespace detail

}  // namespace loom

#define LOOM_THROW(ErrorType, ...) \
  ::loom::detail::throwAt<ErrorType>(__FILE__, __LINE__, __VA_ARGS__)

#define LOOM_CHECK_T(ErrorType, cond, ...)                                       \
  do {                                                                           \
    if (!(cond)) [[unlikely]] {                                                  \
      ::loom::detail::throwAt<ErrorType>(__FILE__, __LINE__,                     \
                                         #cond ": " __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                            \
  } while (0)

#define LOOM_CHECK(cond, ...) LOOM_CHECK_T(::loom::InvalidArgumentError, cond, __VA_ARGS__)

#define LOOM_CHECK_OP_(op, a, b, ...)                                           \
  do {                                                                          \
    const auto& loom_a_ = (a);                                                  \
    const auto& loom_b_ = (b);                                                  \
    if (!(loom_a_ op loom_b_)) [[unlikely]] {                                   \
      ::loom::detail::throwAt<::loom::InvalidArgumentError>(                    \
          __FILE__, __LINE__, #a " " #op " " #b " (", loom_a_, " vs ", loom_b_, \
          ")" __VA_OPT__(, ": ", ) __VA_ARGS__);                                \
    }                                                                           \
  } while (0)

#define LOOM_CHECK_EQ(a, b, ...) LOOM_CHECK_OP_(==, a, b, __VA_ARGS__)
#define LOOM_CHECK_NE(a, b, ...) LOOM_CHECK_OP_(!=, a, b, __VA_ARGS__)
#define LOOM_CHECK_LT(a, b, ...) LOOM_CHECK_OP_(<, a, b, __VA_ARGS__)
#define LOOM_CHECK_LE(a, b, ...) LOOM_CHECK_OP_(<=, a, b, __VA_ARGS__)
#define LOOM_CHECK_GT(a, b, ...) LOOM_CHECK_OP_(>, a, b, __VA_ARGS__)
#define LOOM_CHECK_GE(a, b, ...) LOOM_CHECK_OP_(>=, a, b, __VA_ARGS__)

#ifdef NDEBUG
#define LOOM_DCHECK(cond, ...) \
  do {                         \
  } while (0)
#else
#define LOOM_DCHECK(cond, ...) LOOM_CHECK(cond, __VA_ARGS__)
#endif

// Evaluates a POSIX call that returns -1 and sets errno on failure; retries on EINTR.
// Yields the call's result. Throws IoError naming the call, the context and strerror.
#define LOOM_SYSCHECK(expr, ...)                                                                 \
  ([&]() {                                                                                       \
    for (;;) {                                                                                   \
      auto loom_rv_ = (expr);                                                                    \
      if (loom_rv_ != -1) return loom_rv_;                                                       \
      const int loom_err_ = errno;                                                               \
      if (loom_err_ == EINTR) continue;                                                          \
      ::loom::detail::throwAt<::loom::IoError>(__FILE__, __LINE__,                               \
                                               #expr " failed" __VA_OPT__(, ": ", ) __VA_ARGS__, \
                                               ": ", ::loom::detail::errnoText(loom_err_));      \
    }                                                                                            \
  }())
