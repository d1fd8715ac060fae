#include "myriad/parallel/buffer_broadcast.h"

#include <map>

#include "myriad/util/error.h"

namespace myriad {

BufferBroadcast::BufferBroadcast(const std::vector<torch::Tensor>& buffers, Communicator& comm)
    : comm_(comm) {
  if (comm_.size() == 1) return;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const torch::Tensor& b : buffers) {
    MYRIAD_CHECK(b.is_contiguous(), "a buffer to broadcast must be contiguous");
    by_dtype[b.scalar_type()].push_back(b);
  }
  const torch::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype) {
    int64_t numel = 0;
    for (const torch::Tensor& b : group) numel += b.numel();
    torch::Tensor flat = torch::empty({numel}, group.front().options());
    int64_t offset = 0;
    for (torch::Tensor b : group) {
      flat.narrow(0, offset, b.numel()).copy_(b.reshape(-1));
      // The module's own tensor now views the flat one: its in-place updates land there.
      b.set_(flat.storage(), offset, b.sizes(), b.strides());
      buffers_.push_back(b);
      places_.push_back(b.data_ptr());
      offset += b.numel();
    }
    flats_.push_back(std::move(flat));
  }
}

void BufferBroadcast::broadcast() {
  // Anything that gave a buffer new storage (a load that replaced it rather than copying into
  // it) would leave it out of the broadcast without a sign: refuse instead.
  for (size_t k = 0; k < buffers_.size(); ++k) {
    MYRIAD_CHECK(buffers_[k].data_ptr() == places_[k],
                 "buffer {} of {} no longer lies in the broadcast's flat tensor: it was given new "
                 "storage after the start",
                 k, buffers_.size());
  }
  for (torch::Tensor& flat : flats_) comm_.broadcast(flat, 0);
}

}  // namespace myriad
