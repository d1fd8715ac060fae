#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace myriad {

// A progress bar for long conversions, on stderr: redrawn in place on a terminal, a line every
// 10% otherwise (logs, CI). Shows count, percentage, rate and time left.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  void advance(int64_t n);
  // Ends the bar with a final line.
  void finish();

 private:
  void draw(bool final);

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  int64_t last_decile_ = -1;
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace myriad
