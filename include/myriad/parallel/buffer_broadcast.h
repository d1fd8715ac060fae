#pragma once

#include <torch/torch.h>

#include <vector>

#include "myriad/comm/communicator.h"

namespace myriad {

// DDP's rule for buffers (batch-norm running statistics): every replica takes the first one's
// before each step. The buffers are moved once into one flat tensor per dtype and left there as
// views, so a step broadcasts that tensor in place: one collective per dtype and no copies. Copying
// r200's 450 buffers of a stage in and out each step queued about 900 kernels, 7-8 ms of host
// time in which the GPU waited at the start of every pipeline step. With one replica there is
// nothing to do, and the buffers are left where they are.
class BufferBroadcast {
 public:
  BufferBroadcast(const std::vector<torch::Tensor>& buffers, Communicator& comm);

  // The first replica's buffers into every replica's (collective).
  void broadcast();

 private:
  Communicator& comm_;
  std::vector<torch::Tensor> flats_;
  std::vector<torch::Tensor> buffers_;
  std::vector<const void*> places_;  // each buffer's place in its flat tensor
};

}  // namespace myriad
