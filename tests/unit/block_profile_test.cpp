// The block profile that plans pipeline cuts and that myriad-doctor predicts the step from times
// what every later step takes: each block's first run (cuDNN's engine search under
// --cudnn-benchmark, the plans of --conv-statistics, lazy initialisation) stays out of it.
#include "myriad/parallel/block_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "myriad/util/error.h"
#include "myriad/util/format.h"

namespace myriad {
namespace {

constexpr auto kFirstRun = std::chrono::milliseconds(1000);
constexpr auto kRun = std::chrono::milliseconds(50);

// Two linear blocks that each take kRun (their work, as a device's kernels would); the first
// takes kFirstRun more the first time it runs.
class SlowFirstRun : public Backbone {
 public:
  SlowFirstRun() {
    for (int64_t b = 0; b < 2; ++b) {
      const std::string name = str_format("layer{}", b);
      layers_.push_back(register_module(name, torch::nn::Linear(8, 8)));
      add_block(name, {name});
    }
  }
  Activations forward_block(int64_t block, Activations in) override {
    ++runs[block];
    std::this_thread::sleep_for(block == 0 && runs[block] == 1 ? kFirstRun + kRun : kRun);
    in.x = layers_[block]->forward(in.x);
    return in;
  }
  std::string to_onnx(OnnxGraph&, const std::string&) const override {
    MYRIAD_THROW("no ONNX graph for a test backbone");
  }

  std::vector<int> runs = {0, 0};

 private:
  std::vector<torch::nn::Linear> layers_;
};

// Each block's time is its own work: had the first run counted, block 0 would hold most of the
// whole backbone's measured time (the blocks' shares of it follow their own times), and block 1
// a small part of its kRun.
TEST(BlockProfile, TheFirstRunIsLeftOutOfTheBlocksTimes) {
  const auto net = std::make_shared<SlowFirstRun>();
  net->train();
  const std::vector<BlockCost> costs =
      profile_blocks(*net, {torch::randn({4, 8}), torch::arange(4), torch::Tensor()}, torch::kCPU,
                     std::nullopt, 3.0);
  ASSERT_EQ(costs.size(), 2u);
  const double run = std::chrono::duration<double>(kRun).count();
  const double first_run = std::chrono::duration<double>(kFirstRun).count();
  for (size_t b = 0; b < costs.size(); ++b) {
    SCOPED_TRACE(str_format("block {}", b));
    EXPECT_GT(net->runs[b], 1);
    EXPECT_GT(costs[b].launch_seconds, run / 2);
    EXPECT_LT(costs[b].launch_seconds, first_run / 4);
    EXPECT_EQ(costs[b].device_seconds, costs[b].launch_seconds);  // the CPU's host is its device
  }
}

}  // namespace
}  // namespace myriad
