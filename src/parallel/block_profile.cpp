#include "myriad/parallel/block_profile.h"

#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/log.h"
#include "stage_blocks.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "graph_capture.h"
#endif

namespace myriad {

namespace {

using Clock = std::chrono::steady_clock;

void wait_for(const torch::Device& device) {
  synchronize_device(device);
}

#ifdef MYRIAD_WITH_CUDA
// The GPU's time per call of `work` as a stage that replays CUDA graphs meets it: `work` recorded
// as a graph, whose replays the events time. Timing the kernels queued eagerly behind a spinning
// kernel instead came out 11-13% above the replayed stages (r200, P = 2, nvidia-h200-x4): a
// graph's kernels also start closer together than a stream's. A block that cannot be recorded
// keeps its time launched and waited for: profiling must not end the run (the other ranks wait
// for its result).
double replay_seconds(const std::function<void()>& work, int calls, double waited_seconds,
                      const torch::Device& device) {
  const c10::DeviceIndex index = device.index();
  const c10::cuda::CUDAGuard on_device(device);
  try {
    at::cuda::CUDAGraph graph;
    {
      const AutocastCacheOff cache_off;
      const SideStream side(index);
      work();  // on the recording stream first, as StageGraphs' warm-ups
      Capture capture(graph, index);
      work();
      capture.end();
    }
    graph.replay();
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(index);
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record(stream);
    for (int c = 0; c < calls; ++c) graph.replay();
    stop.record(stream);
    stop.synchronize();
    return start.elapsed_time(stop) / 1e3 / calls;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    log_debug(
        "profile: a block recorded as a CUDA graph failed ({}): its time launched and waited for "
        "stands",
        what.substr(0, what.find('\n')));
    return waited_seconds;
  }
}
#endif

// The host's time to launch the whole backbone's forward from `input` and one backward, as a
// stage issues its blocks: the least of `repeats` tries, each behind a wait for the device. None
// where the whole backbone's activations do not fit (the blocks' own launch times then stand).
std::optional<double> chained_launch_seconds(Backbone& backbone, const Activations& input,
                                             const torch::Device& device,
                                             std::optional<torch::ScalarType> autocast,
                                             int repeats) {
  const auto run = [&] {
    Activations out;
    {
      const AutocastGuard guard(device, autocast);
      out = backbone.forward_blocks(input, 0, backbone.num_blocks());
    }
    out.x.backward(torch::ones_like(out.x));
  };
  try {
    run();  // warm-up
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
      wait_for(device);
      const auto start = Clock::now();
      run();
      best = std::min(best, seconds_since(start));
    }
    wait_for(device);
    return best;
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    log_debug("profile: the whole backbone's launches could not be timed ({}): each block's stand",
              what.substr(0, what.find('\n')));
    return std::nullopt;
  }
}

void clear_gradients(Backbone& backbone) {
  for (const torch::Tensor& p : backbone.parameters()) p.mutable_grad().reset();
}

// Profiling trains nothing: the buffers (batch-norm statistics) are put back afterwards, and
// every tensor moved to the device goes back where it was.
class BackboneState {
 public:
  explicit BackboneState(Backbone& backbone) : backbone_(backbone) {
    for (const auto& b : backbone.named_buffers())
      buffers_.emplace_back(b.value(), b.value().clone());
    for (auto& [name, tensor] : backbone.state_dict()) homes_.emplace(name, tensor.device());
  }

  void restore() const {
    clear_gradients(backbone_);
    torch::NoGradGuard no_grad;
    for (auto& [buffer, saved] : buffers_) buffer.copy_(saved);
    for (auto& [name, tensor] : backbone_.state_dict()) {
      const torch::Device home = homes_.at(name);
      if (tensor.device() != home) tensor.set_data(tensor.to(home));
    }
  }

 private:
  Backbone& backbone_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;
  std::map<std::string, torch::Device> homes_;
};

// Block b's costs from its input `in`; `in` becomes its output, the next block's input.
BlockCost profile_block(Backbone& backbone, int64_t b, Activations& in, const torch::Device& device,
                        std::optional<torch::ScalarType> autocast, double state_factor,
                        int repeats) {
  move_blocks(backbone, b, b + 1, device);
  const auto run = [&](bool keep_graph) {
    Activations x = in;
    if (b > 0) x.x = in.x.detach().requires_grad_(true);
    // As a stage runs it: with activation checkpointing a middle block keeps only its input
    // and computes its forward again in backward.
    Activations out;
    {
      const AutocastGuard guard(device, autocast);
      out = backbone.forward_blocks(x, b, b + 1);
    }
    if (keep_graph) return out;
    out.x.backward(torch::ones_like(out.x));
    return out;
  };
  run(false);  // warm-up: kernels chosen (cuDNN's engines timed), memory pools grown
  wait_for(device);
  // The host's launches alone, then with the device's work waited for: the first is what an
  // eager stage's host spends on the block, the second stands for the device's time where no
  // graph can time it.
  BlockCost cost;
  const auto start = Clock::now();
  for (int r = 0; r < repeats; ++r) run(false);
  cost.launch_seconds = seconds_since(start) / repeats;
  wait_for(device);
  cost.device_seconds = seconds_since(start) / repeats;
  Activations out;
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    cost.device_seconds = replay_seconds([&] { run(false); }, repeats, cost.device_seconds, device);
    // What forward keeps for backward: allocated memory with the graph alive, against without.
    const int64_t before = allocated_device_memory(device);
    out = run(true);
    wait_for(device);
    cost.activation_bytes = static_cast<double>(allocated_device_memory(device) - before);
  }
#endif
  if (!out.x.defined()) {
    out = run(true);
    cost.activation_bytes = static_cast<double>(tensor_bytes(out.x));
  }
  for (const auto& [name, tensor] : backbone.state_dict()) {
    if (backbone.block_of(name) != b) continue;
    cost.state_bytes +=
        static_cast<double>(tensor_bytes(tensor)) * (tensor.requires_grad() ? state_factor : 1.0);
  }
  in = {out.x.detach(), out.keys, out.restore};
  clear_gradients(backbone);
  return cost;
}

}  // namespace

std::vector<BlockCost> profile_blocks(Backbone& backbone, const Activations& sample,
                                      const torch::Device& device,
                                      std::optional<torch::ScalarType> autocast,
                                      double state_factor) {
  constexpr int kRepeats = 3;
  const BackboneState saved(backbone);
  std::vector<BlockCost> costs;
  const Activations input{backbone.in_layout(sample.x.to(device)),
                          sample.keys.defined() ? sample.keys.to(device) : sample.keys,
                          sample.restore};
  Activations in = input;
  for (int64_t b = 0; b < backbone.num_blocks(); ++b)
    costs.push_back(profile_block(backbone, b, in, device, autocast, state_factor, kRepeats));
  // Every block is on the device now.
  const std::optional<double> chain =
      chained_launch_seconds(backbone, input, device, autocast, kRepeats);
  saved.restore();
  if (!chain) return costs;
  double alone = 0.0;
  for (const BlockCost& cost : costs) alone += cost.launch_seconds;
  log_info(
      "pipeline profile: the whole backbone launched in {:.2f} ms, its blocks alone in {:.2f} ms",
      1e3 * *chain, 1e3 * alone);
  costs = chained_launches(std::move(costs), *chain);
  // On the CPU the host is the device: its blocks take what the chain says there too.
  if (!device.is_cuda()) {
    for (BlockCost& cost : costs) cost.device_seconds = cost.launch_seconds;
  }
  return costs;
}

}  // namespace myriad
