#include "myriad/train/stage_graphs.h"

#include <chrono>
#include <utility>

#include "myriad/train/gradient_sync.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/log.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

struct StageGraphs::Slot {
#ifdef MYRIAD_WITH_CUDA
  at::cuda::CUDAGraph forward;
  at::cuda::CUDAGraph backward;
#endif
  bool recorded = false;
  Activations in;   // what forward() copies each micro-batch into
  Activations out;  // what the forward graph writes
  torch::Tensor output_grad;
  torch::Tensor input_grad;
};

StageGraphs::StageGraphs(Backbone& backbone, int64_t begin_block, int64_t end_block,
                         std::optional<torch::ScalarType> autocast,
                         std::vector<torch::Tensor> params, bool input_grad, bool float32_output,
                         int slots)
    : backbone_(backbone),
      begin_(begin_block),
      end_(end_block),
      autocast_(autocast),
      params_(std::move(params)),
      input_grad_(input_grad),
      float32_output_(float32_output) {
#ifndef MYRIAD_WITH_CUDA
  MYRIAD_THROW("CUDA graphs need a build with CUDA");
#endif
  MYRIAD_CHECK(slots > 0, "CUDA graphs of a stage need at least one slot");
  for (int s = 0; s < slots; ++s) slots_.push_back(std::make_unique<Slot>());
}

StageGraphs::~StageGraphs() = default;

Activations StageGraphs::run(const Activations& in) const {
  std::unique_ptr<AutocastGuard> guard;
  if (autocast_) guard = std::make_unique<AutocastGuard>(in.x.device(), *autocast_);
  Activations out = backbone_.forward_blocks(in, begin_, end_);
  if (float32_output_) out.x = out.x.to(torch::kFloat32);
  return out;
}

#ifdef MYRIAD_WITH_CUDA

namespace {

// Eager runs before recording: the first picks cuDNN's algorithms, the second runs as the graph
// will.
constexpr int kWarmups = 2;

bool same_layout(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.strides() == b.strides() &&
                          a.scalar_type() == b.scalar_type());
}

torch::Tensor static_copy(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone(torch::MemoryFormat::Preserve) : t;
}

}  // namespace

void StageGraphs::record(Slot& slot, const Activations& in, GradientSynchronizer& sync) {
  const torch::Device device = in.x.device();
  MYRIAD_CHECK(device.is_cuda(), "CUDA graphs need a CUDA device, not {}", device.str());
  const auto start = std::chrono::steady_clock::now();
  slot.in = {static_copy(in.x).requires_grad_(input_grad_), static_copy(in.keys),
             static_copy(in.restore)};
  // The warm-up trains nothing: the stage's batch-norm statistics are put back afterwards, and
  // the gradient buckets ignore it.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;
  for (const auto& item : backbone_.named_buffers()) {
    const int64_t block = backbone_.block_of(item.key());
    if (begin_ <= block && block < end_) buffers.emplace_back(item.value(), item.value().clone());
  }
  const std::vector<torch::Tensor> views = sync.gradient_views();
  std::vector<torch::Tensor> inputs = params_;
  if (input_grad_) inputs.push_back(slot.in.x);
  const auto gradients = [&](const Activations& out, const torch::Tensor& grad) {
    return torch::autograd::grad({out.x}, inputs, {grad}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  };
  sync.pause_hooks(true);
  // Cast weights must be made inside the graph, not taken from a cache that is emptied after it.
  const bool cache = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent ready, recorded;
  ready.record(current);
  ready.block(side);
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    for (int w = 0; w < kWarmups; ++w) {
      const Activations out = run(slot.in);
      gradients(out, torch::ones_like(out.x));
    }
    // Other threads (data loading, checkpoint writing) may use CUDA meanwhile.
    slot.forward.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    slot.out = run(slot.in);
    slot.forward.capture_end();
    slot.output_grad = torch::empty_like(slot.out.x);
    slot.backward.capture_begin(slot.forward.pool(), cudaStreamCaptureModeThreadLocal);
    {
      const std::vector<torch::Tensor> grads = gradients(slot.out, slot.output_grad);
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < params_.size(); ++k) {
        if (grads[k].defined()) views[k].add_(grads[k]);
      }
      if (input_grad_) slot.input_grad = grads.back();
    }
    slot.backward.capture_end();
    recorded.record(side);
  }
  recorded.block(current);
  at::autocast::set_autocast_cache_enabled(cache);
  sync.pause_hooks(false);
  {
    torch::NoGradGuard no_grad;
    for (auto& [buffer, saved] : buffers) buffer.copy_(saved);
  }
  slot.out = {slot.out.x.detach(), slot.out.keys, slot.out.restore};
  slot.recorded = true;
  log_info("CUDA graphs: blocks [{}, {}) recorded for micro-batches of {} in {:.1f} s", begin_,
           end_, in.x.sizes(),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

Activations StageGraphs::forward(int slot_index, const Activations& in,
                                 GradientSynchronizer& sync) {
  std::unique_ptr<Slot>& slot = slots_.at(static_cast<size_t>(slot_index));
  const bool same = slot->recorded && same_layout(slot->in.x, in.x) &&
                    same_layout(slot->in.keys, in.keys) &&
                    same_layout(slot->in.restore, in.restore);
  if (!same) {
    if (slot->recorded) {
      log_warn("CUDA graphs: a micro-batch of {} after {}: recording the stage again", in.x.sizes(),
               slot->in.x.sizes());
    }
    slot = std::make_unique<Slot>();
    record(*slot, in, sync);
  }
  {
    torch::NoGradGuard no_grad;
    slot->in.x.copy_(in.x);
    if (in.keys.defined()) slot->in.keys.copy_(in.keys);
    if (in.restore.defined()) slot->in.restore.copy_(in.restore);
  }
  slot->forward.replay();
  return slot->out;
}

torch::Tensor StageGraphs::backward(int slot_index, const torch::Tensor& output_grad) {
  Slot& slot = *slots_.at(static_cast<size_t>(slot_index));
  MYRIAD_CHECK(slot.recorded, "CUDA graphs: backward of slot {} before its forward", slot_index);
  {
    torch::NoGradGuard no_grad;
    slot.output_grad.copy_(output_grad);
  }
  slot.backward.replay();
  return slot.input_grad;
}

#else

// Unreachable: the constructor refuses a build without CUDA.
void StageGraphs::record(Slot&, const Activations&, GradientSynchronizer&) {}
Activations StageGraphs::forward(int, const Activations&, GradientSynchronizer&) {
  return {};
}
torch::Tensor StageGraphs::backward(int, const torch::Tensor&) {
  return {};
}

#endif

}  // namespace myriad
