#include "myriad/util/host_copy.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

struct HostCopy::Arrival {
#ifdef MYRIAD_WITH_CUDA
  at::cuda::CUDAEvent event;  // recorded behind the copy
#endif
};

HostCopy::HostCopy(const torch::Tensor& source) {
#ifdef MYRIAD_WITH_CUDA
  if (source.is_cuda()) {
    // Pinned memory: a copy into pageable memory would make the host wait for the stream.
    host_ = torch::empty(source.sizes(),
                         torch::TensorOptions(source.scalar_type()).pinned_memory(true));
    host_.copy_(source, /*non_blocking=*/true);
    arrival_ = std::make_unique<Arrival>();
    arrival_->event.record(c10::cuda::getCurrentCUDAStream(source.device().index()));
    return;
  }
#endif
  host_ = source.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

HostCopy::~HostCopy() = default;
HostCopy::HostCopy(HostCopy&&) noexcept = default;
HostCopy& HostCopy::operator=(HostCopy&&) noexcept = default;

const torch::Tensor& HostCopy::get() {
#ifdef MYRIAD_WITH_CUDA
  if (arrival_) arrival_->event.synchronize();
#endif
  arrival_.reset();
  return host_;
}

}  // namespace myriad
