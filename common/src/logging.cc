#include "loom/common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>

#include "loom/common/settings.h"

namespace loom {
namespace {

// LOOM_LOG_LEVEL, read once. Logging must always work, so a bad value is not an error: it is
// one warning naming the variable, the value and the accepted levels, and the warning level.
LogLevel levelFromEnv() {
  std::string level;
  try {
    level = settings::choice("LOOM_LOG_LEVEL").value_or("warning");
  } catch (const std::exception& e) {
    // Straight to the sink (logMessage does not consult the level, which is not set yet).
    logMessage(LogLevel::kWarning, detail::str(e.what(), "; using warning"));
    return LogLevel::kWarning;
  }
  if (level == "debug") return LogLevel::kDebug;
  if (level == "info") return LogLevel::kInfo;
  if (level == "error") return LogLevel::kError;
  if (level == "off") return LogLevel::kOff;
  return LogLevel::kWarning;
}

std::atomic<LogLevel>& currentLevel() {
  static std::atomic<LogLevel> level{levelFromEnv()};
  return level;
}

spdlog::logger& logger() {
  // Logs go to stderr so that program output (bench tables) stays clean on stdout.
  // Never destroyed: a detached thread may log while the process exits (the flight record
  // listener's stop request, when the store host exited first), after static destructors ran. A
  // static shared_ptr freed the logger and its sink there, and that thread's log line crashed
  // loom-bench at exit (bench_programs_test; 4-6 runs in 60 under load). The object is reachable
  // through this pointer, so leak checkers do not report it.
  static spdlog::logger* const instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* l = new spdlog::logger("loom", std::move(sink));
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
