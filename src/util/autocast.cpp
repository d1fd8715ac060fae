#include "myriad/util/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "myriad/util/error.h"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define MYRIAD_AUTOCAST_BY_DEVICE_TYPE 1
#endif

namespace myriad {

namespace {

bool autocast_enabled(torch::DeviceType type) {
#ifdef MYRIAD_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

torch::ScalarType autocast_dtype(torch::DeviceType type) {
#ifdef MYRIAD_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                              : at::autocast::get_autocast_cpu_dtype();
#endif
}

void set_autocast(torch::DeviceType type, bool enabled, torch::ScalarType dtype) {
#ifdef MYRIAD_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == torch::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

}  // namespace

std::optional<torch::ScalarType> active_autocast(torch::DeviceType type) {
  if (!autocast_enabled(type)) return std::nullopt;
  return autocast_dtype(type);
}

AutocastGuard::AutocastGuard(const torch::Device& device, std::optional<torch::ScalarType> dtype)
    : active_(dtype.has_value()),
      type_(device.type()),
      was_enabled_(autocast_enabled(device.type())),
      was_dtype_(autocast_dtype(device.type())) {
  if (!active_) return;
  MYRIAD_CHECK(*dtype == torch::kBFloat16 || *dtype == torch::kFloat16,
               "autocast runs in bfloat16 or float16");
  MYRIAD_CHECK(type_ == torch::kCUDA || *dtype == torch::kBFloat16, "float16 autocast needs a GPU");
  set_autocast(type_, true, *dtype);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  set_autocast(type_, was_enabled_, was_dtype_);
  at::autocast::clear_cache();
}

}  // namespace myriad
