#pragma once

#include <string>

#include "myriad/util/format.h"

namespace myriad {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// "debug", "info", "warn", "error" or "off"; anything else is a UsageError.
LogLevel parse_log_level(const std::string& name);

struct LogConfig {
  int rank = 0;
  int world_size = 1;
  bool all_ranks = false;  // by default only rank 0 logs below kError
  LogLevel level = LogLevel::kInfo;
};

// Environment defaults: MYRIAD_LOG_LEVEL and MYRIAD_LOG_ALL_RANKS=1.
LogConfig log_config_from_env(int rank, int world_size);
void configure_logging(const LogConfig& config);
const LogConfig& logging_config();

// True when a message of `level` from this rank would be written.
bool log_enabled(LogLevel level);
// Writes one line stamped with time, rank and level. Errors are written on every rank.
void log_write(LogLevel level, const std::string& message);
// Writes regardless of the rank filter: for events only this rank knows about.
void log_write_this_rank(LogLevel level, const std::string& message);

template <class... Args>
void log_debug(std::string_view fmt, const Args&... args) {
  if (log_enabled(LogLevel::kDebug)) log_write(LogLevel::kDebug, str_format(fmt, args...));
}
template <class... Args>
void log_info(std::string_view fmt, const Args&... args) {
  if (log_enabled(LogLevel::kInfo)) log_write(LogLevel::kInfo, str_format(fmt, args...));
}
template <class... Args>
void log_warn(std::string_view fmt, const Args&... args) {
  if (log_enabled(LogLevel::kWarn)) log_write(LogLevel::kWarn, str_format(fmt, args...));
}
template <class... Args>
void log_error(std::string_view fmt, const Args&... args) {
  log_write(LogLevel::kError, str_format(fmt, args...));
}

}  // namespace myriad
