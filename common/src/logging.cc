#include "loom/common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace loom {
namespace {

LogLevel levelFromEnv() {
  const char* env = std::getenv("LOOM_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kWarning;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(env, "warning") == 0 || std::strcmp(env, "warn") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  if (std::strcmp(env, "off") == 0) return LogLevel::kOff;
  return LogLevel::kWarning;
}

std::atomic<LogLevel>& currentLevel() {
  static std::atomic<LogLevel> level{levelFromEnv()};
  return level;
}

spdlog::logger& logger() {
  // Logs go to stderr so that program output (bench tables) stays clean on stdout.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("loom", sink);
    l->set_level(spdlog::level::trace);
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum toSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarning:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

}  // namespace

void setLogLevel(LogLevel level) {
  currentLevel().store(level, std::memory_order_relaxed);
}

LogLevel logLevel() {
  return currentLevel().load(std::memory_order_relaxed);
}

bool logEnabled(LogLevel level) {
  return level != LogLevel::kOff && level >= currentLevel().load(std::memory_order_relaxed);
}

void logMessage(LogLevel level, std::string_view message) noexcept {
  try {
    logger().log(toSpdlog(level), "{}", message);
  } catch (...) {
    // Logging must never take the caller down.
  }
}

}  // namespace loom
