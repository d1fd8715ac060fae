#include "myriad/util/host_copy.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <vector>

namespace myriad {
namespace {

std::vector<torch::Device> devices() {
  std::vector<torch::Device> all{torch::kCPU};
  if (torch::cuda::is_available()) all.emplace_back(torch::kCUDA);
  return all;
}

TEST(HostCopy, HoldsTheValuesQueuedBeforeItNotThoseWrittenAfter) {
  for (const torch::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    const torch::Tensor expected = torch::tensor({-3.0, 7.5, 1.0}, torch::kFloat64);
    torch::Tensor source = expected.to(device, /*non_blocking=*/false, /*copy=*/true);
    // Work queued ahead of the copy, which the copy must wait for.
    torch::Tensor big = torch::rand({1024, 1024}, torch::dtype(torch::kFloat32).device(device));
    for (int i = 0; i < 4; ++i) big = big.mm(big).div_(1024.0);
    source.add_(big.sum().mul(0.0).to(torch::kFloat64));
    HostCopy copy(source);
    source.mul_(100.0);  // queued after the copy: not in it
    const torch::Tensor& host = copy.get();
    EXPECT_TRUE(host.device().is_cpu());
    EXPECT_EQ(host.scalar_type(), torch::kFloat64);
    EXPECT_TRUE(torch::equal(host, expected)) << host;
    // A second read returns the same tensor without waiting again.
    EXPECT_TRUE(torch::equal(copy.get(), expected));
    if (device.is_cuda()) {
      EXPECT_TRUE(host.is_pinned());
    }
  }
}

TEST(HostCopy, IsItsOwnTensorNotAViewOfACpuSource) {
  torch::Tensor source = torch::tensor({1, 2, 3}, torch::kInt64);
  HostCopy copy(source);
  source.fill_(0);
  EXPECT_TRUE(torch::equal(copy.get(), torch::tensor({1, 2, 3}, torch::kInt64)));
}

}  // namespace
}  // namespace myriad
