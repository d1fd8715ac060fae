#pragma once

#include <torch/types.h>

namespace myriad {

// Runs the enclosed LibTorch operations under autocast for `device`'s type in `dtype`
// (bfloat16 or float16), restoring the previous state on exit. Hides the API difference between
// LibTorch 1.x (per-device setters) and 2.x (setters taking a device type).
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, torch::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType type_;
  bool was_enabled_;
  torch::ScalarType was_dtype_;
};

}  // namespace myriad
