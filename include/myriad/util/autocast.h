#pragma once

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/types.h>

#include <optional>

namespace myriad {

// Runs the enclosed LibTorch operations under autocast for `device`'s type in `dtype`
// (bfloat16 or float16), restoring the previous state on exit; with no dtype it changes nothing.
// Hides the API difference between LibTorch 1.x (per-device setters) and 2.x (setters taking a
// device type).
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, std::optional<torch::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
  torch::DeviceType type_;
  bool was_enabled_;
  torch::ScalarType was_dtype_;
};

// The dtype autocast computes in on `type` devices here, or nothing when it is off.
std::optional<torch::ScalarType> active_autocast(torch::DeviceType type);

// Suspends autocast for the enclosed operations, which then run in their inputs' dtypes (the
// classifier's chosen precisions, ViT's float32 attention).
class NoAutocast {
 private:
  c10::impl::ExcludeDispatchKeyGuard guard_{c10::autocast_dispatch_keyset};
};

}  // namespace myriad
