#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace myriad {

// Splits device time into named phases: mark("gemm") ends the running phase and starts "gemm".
// On CUDA the boundaries are events on the current stream, so timing adds no synchronisation
// until totals() is read; on the CPU they are host clock readings. Disabled timers cost nothing.
class PhaseTimer {
 public:
  PhaseTimer(const torch::Device& device, bool enabled);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  bool enabled() const { return enabled_; }
  void mark(const std::string& phase);
  // Ends the running phase without starting another.
  void stop();
  // For its scope (left by an exception too), the timer of `timer` (none: nothing) ignores marks:
  // they would come from work queued on another stream, whose events cannot be read against this
  // stream's boundaries.
  class Paused {
   public:
    explicit Paused(PhaseTimer* timer) : timer_(timer) {
      if (timer_ != nullptr) timer_->paused_ = true;
    }
    ~Paused() {
      if (timer_ != nullptr) timer_->paused_ = false;
    }
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    PhaseTimer* timer_;
  };
  // Milliseconds per phase since the last reset (waits for the device).
  std::map<std::string, double> totals();
  void reset();

 private:
  struct Boundary;
  void collect();

  torch::Device device_;
  bool enabled_;
  bool paused_ = false;
  std::string running_;
  std::vector<Boundary> boundaries_;
  std::map<std::string, double> totals_;
};

}  // namespace myriad
