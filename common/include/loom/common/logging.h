// Loom's log lines: "[2026-11-22 00:10:00.123] [loom] [warning] message".
//
// LOOM_LOG_INFO("client ", addr, " closed: ", why) streams its arguments like LOOM_CHECK.
// The level comes from LOOM_LOG_LEVEL (debug, info, warning, error, off; default warning) and
// can be changed with setLogLevel. Thread-safe. Logging never throws.
#pragma once

#include <string>
#include <string_view>

#include "loom/common/error.h"

namespace loom {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
bool logEnabled(LogLevel level);
void logMessage(LogLevel level, std::string_view message) noexcept;

}  // namespace loom

#define LOOM_LOG_(level, ...)                                      \
  do {                                                             \
    if (::loom::logEnabled(level)) {                               \
      ::loom::logMessage(level, ::loom::detail::str(__VA_ARGS__)); \
    }                                                              \
  } while (0)

#define LOOM_LOG_DEBUG(...) LOOM_LOG_(::loom::LogLevel::kDebug, __VA_ARGS__)
#define LOOM_LOG_INFO(...) LOOM_LOG_(::loom::LogLevel::kInfo, __VA_ARGS__)
#define LOOM_LOG_WARNING(...) LOOM_LOG_(::loom::LogLevel::kWarning, __VA_ARGS__)
#define LOOM_LOG_ERROR(...) LOOM_LOG_(::loom::LogLevel::kError, __VA_ARGS__)
