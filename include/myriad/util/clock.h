#pragma once

#include <chrono>
#include <string>

namespace myriad {

// Seconds from `start` to now on the steady clock: the one measure of elapsed time.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds since the Unix epoch on the system clock, for times other processes and hosts read.
double unix_seconds();

// A time in seconds since the Unix epoch as ISO 8601 in UTC, to the second:
// "2024-05-01T12:00:00Z".
std::string utc_text(double seconds);

}  // namespace myriad
