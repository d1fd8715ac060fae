#include "myriad/util/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "myriad/util/error.h"

namespace myriad {

namespace {

LogConfig& config() {
  static LogConfig c;
  return c;
}

std::mutex& write_mutex() {
  static std::mutex m;
  return m;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    default:
      return "";
  }
}

}  // namespace

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  throw UsageError(
      str_format("unknown log level '{}' (expected debug, info, warn, error or off)", name));
}

LogConfig log_config_from_env(int rank, int world_size) {
  LogConfig c;
  c.rank = rank;
  c.world_size = world_size;
  if (const char* level = std::getenv("MYRIAD_LOG_LEVEL"); level != nullptr && level[0] != '\0') {
    c.level = parse_log_level(level);
  }
  if (const char* all = std::getenv("MYRIAD_LOG_ALL_RANKS"); all != nullptr) {
    c.all_ranks = std::string(all) == "1" || std::string(all) == "true";
  }
  return c;
}

void configure_logging(const LogConfig& c) {
  config() = c;
}

const LogConfig& logging_config() {
  return config();
}

bool log_enabled(LogLevel level) {
  const LogConfig& c = config();
  if (level < c.level) return false;
  return level >= LogLevel::kError || c.all_ranks || c.rank == 0;
}

void log_write_this_rank(LogLevel level, const std::string& message) {
  if (level < config().level && level < LogLevel::kError) return;
  using Clock = std::chrono::system_clock;
  const auto now = Clock::now();
  const std::time_t seconds = Clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
  const LogConfig& c = config();
  const std::string line = str_format("{}.{:03} [{}/{}] {:<5} {}\n", stamp, millis, c.rank,
                                      c.world_size, level_name(level), message);
  std::FILE* stream = level >= LogLevel::kWarn ? stderr : stdout;
  std::lock_guard<std::mutex> lock(write_mutex());
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

void log_write(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  log_write_this_rank(level, message);
}

}  // namespace myriad
