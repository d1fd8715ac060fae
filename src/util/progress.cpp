#include "myriad/util/progress.h"

#include <unistd.h>

#include <cstdio>

#include "myriad/util/format.h"

namespace myriad {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total),
      terminal_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void ProgressBar::advance(int64_t n) {
  done_ += n;
  const auto now = std::chrono::steady_clock::now();
  const int64_t decile = total_ > 0 ? done_ * 10 / total_ : 0;
  if (terminal_ ? now - last_draw_ > std::chrono::milliseconds(200) : decile != last_decile_) {
    last_decile_ = decile;
    last_draw_ = now;
    draw(false);
  }
}

void ProgressBar::finish() {
  // A log already has the 100% line.
  if (terminal_ || last_decile_ != 10) draw(true);
}

void ProgressBar::draw(bool final) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? done_ / seconds : 0.0;
  const double fraction =
      total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(fraction * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  const double left = rate > 0 ? (total_ - done_) / rate : 0.0;
  const std::string line = str_format("{} [{}] {}/{} ({:.0f}%) {:.0f}/s, {:.0f} s left", label_,
                                      bar, done_, total_, 100.0 * fraction, rate, left);
  std::fprintf(stderr, terminal_ && !final ? "\r%s" : terminal_ ? "\r%s\n" : "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace myriad
