#include "myriad/comm/comm_factory.h"

#ifdef MYRIAD_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "myriad/comm/mpi_communicator.h"
#include "myriad/comm/nccl_communicator.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/error.h"

namespace myriad {

CommFactory::CommFactory(const ProcessContext& context)
    : context_(context), mpi_(std::make_unique<MpiCommunicator>(context.world())) {}

CommFactory::~CommFactory() = default;

std::unique_ptr<Communicator> CommFactory::create(const torch::Device& device) const {
  if (device.is_cpu()) return std::make_unique<MpiCommunicator>(context_.world());
  MYRIAD_CHECK(device.is_cuda(), "no communicator moves tensors on {}", device.str());
#ifdef MYRIAD_WITH_NCCL
  return std::make_unique<NcclCommunicator>(
      context_.world(),
      device.has_index() ? device : torch::Device(torch::kCUDA, c10::cuda::current_device()));
#else
  MYRIAD_THROW("CUDA tensors need the NCCL backend, which this build of myriad does not have");
#endif
}

Communicator& CommFactory::for_device(const torch::Device& device) {
  if (device.is_cpu()) return *mpi_;
  MYRIAD_CHECK(device.is_cuda(), "no communicator moves tensors on {}", device.str());
#ifdef MYRIAD_WITH_NCCL
  const torch::Device indexed =
      device.has_index() ? device : torch::Device(torch::kCUDA, c10::cuda::current_device());
  if (!nccl_) nccl_ = create(indexed);
  MYRIAD_CHECK(nccl_->device() == indexed,
               "this rank's NCCL communicator drives {}, not {}; use one GPU per rank",
               nccl_->device().str(), indexed.str());
  return *nccl_;
#else
  MYRIAD_THROW("CUDA tensors need the NCCL backend, which this build of myriad does not have");
#endif
}

}  // namespace myriad
