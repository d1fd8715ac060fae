#include "myriad/comm/comm_factory.h"

#ifdef MYRIAD_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "myriad/comm/mpi_communicator.h"
#include "myriad/comm/nccl_communicator.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/error.h"

namespace myriad {

CommFactory::CommFactory(const ProcessContext& context)
    : context_(context), mpi_(std::make_unique<MpiCommunicator>(context.world())) {}

CommFactory::~CommFactory() = default;

namespace {

std::unique_ptr<Communicator> create_over(MPI_Comm comm, const torch::Device& device,
                                          const CommOptions& options) {
  if (device.is_cpu()) return std::make_unique<MpiCommunicator>(comm);
  MYRIAD_CHECK(device.is_cuda(), "no communicator moves tensors on {}", device.str());
#ifdef MYRIAD_WITH_NCCL
  return std::make_unique<NcclCommunicator>(
      comm, device.has_index() ? device : torch::Device(torch::kCUDA, c10::cuda::current_device()),
      options.max_ctas);
#else
  (void)options;
  MYRIAD_THROW("CUDA tensors need the NCCL backend, which this build of myriad does not have");
#endif
}

}  // namespace

std::unique_ptr<Communicator> CommFactory::create(const torch::Device& device,
                                                  const CommOptions& options) const {
  MYRIAD_CHECK(options.max_ctas >= 0, "a communicator's CTAs per kernel must be at least 0, got {}",
               options.max_ctas);
  return create_over(context_.world(), device, options);
}

std::unique_ptr<Communicator> CommFactory::create_split(const torch::Device& device, int color,
                                                        int key) const {
  MPI_Comm split = MPI_COMM_NULL;
  MYRIAD_CHECK_MPI(MPI_Comm_split(context_.world(), color, key, &split));
  // Communicators duplicate what they are given; the split itself is not kept.
  try {
    std::unique_ptr<Communicator> comm = create_over(split, device, CommOptions{});
    MYRIAD_CHECK_MPI(MPI_Comm_free(&split));
    return comm;
  } catch (...) {
    MPI_Comm_free(&split);
    throw;
  }
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
