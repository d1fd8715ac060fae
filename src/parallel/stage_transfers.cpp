#include "stage_transfers.h"

#include "myriad/comm/communicator.h"
#include "myriad/util/timeline.h"
#include "stage_blocks.h"

namespace myriad {

StageTransfers::StageTransfers(Communicator* pipe, std::unique_ptr<PartsStream> parts)
    : pipe_(pipe), parts_(std::move(parts)) {}

void StageTransfers::send(const std::vector<torch::Tensor>& tensors, int peer) {
  const Timeline::Scope traced(timeline_, "send");
  if (parts_) parts_->join();
  count_sent(tensors);
  pipe_->send(tensors, peer);
  if (parts_) parts_->mark();
}

std::vector<torch::Tensor> StageTransfers::recv(const std::vector<torch::ScalarType>& dtypes,
                                                int peer) {
  const Timeline::Scope traced(timeline_, "receive");
  if (parts_) parts_->join();
  std::vector<torch::Tensor> got = pipe_->recv(dtypes, peer);
  if (parts_) parts_->mark();
  return got;
}

std::vector<torch::Tensor> StageTransfers::exchange(const std::vector<torch::Tensor>& tensors,
                                                    const std::vector<torch::ScalarType>& dtypes,
                                                    int peer) {
  const Timeline::Scope traced(timeline_, "exchange");
  if (parts_) parts_->join();
  count_sent(tensors);
  std::vector<torch::Tensor> got = pipe_->exchange(tensors, dtypes, peer);
  if (parts_) parts_->mark();
  return got;
}

void StageTransfers::count_sent(const std::vector<torch::Tensor>& tensors) {
  for (const torch::Tensor& t : tensors) bytes_sent_ += static_cast<double>(tensor_bytes(t));
}

double StageTransfers::take_bytes_sent() {
  const double bytes = bytes_sent_;
  bytes_sent_ = 0.0;
  return bytes;
}

}  // namespace myriad
