#pragma once

#include <torch/types.h>

#include <memory>

namespace myriad {

// A small device tensor copied to host memory behind the work queued so far on its stream. get()
// waits for that work alone, not for work queued after the copy, so the host can check a value
// while the device goes on. On the CPU the copy is made at once.
class HostCopy {
 public:
  explicit HostCopy(const torch::Tensor& source);
  ~HostCopy();
  HostCopy(HostCopy&&) noexcept;
  HostCopy& operator=(HostCopy&&) noexcept;

  // The copy, once it has arrived.
  const torch::Tensor& get();

 private:
  struct Arrival;
  torch::Tensor host_;
  std::unique_ptr<Arrival> arrival_;
};

}  // namespace myriad
