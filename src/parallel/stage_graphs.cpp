#include "myriad/parallel/stage_graphs.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "myriad/parallel/gradient_sync.h"
#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/log.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/util/Exception.h>

#include "graph_capture.h"
#endif

namespace myriad {

struct StageGraphs::Slot {
#ifdef MYRIAD_WITH_CUDA
  at::cuda::CUDAGraph forward;
  at::cuda::CUDAGraph backward;       // sums the gradients into the buckets
  at::cuda::CUDAGraph backward_last;  // ... and all-reduces them: the step's last pass
#endif
  Activations in;   // what forward() copies each micro-batch into
  Activations out;  // what the forward graph writes
  torch::Tensor output_grad;
  torch::Tensor input_grad, input_grad_last;  // what each backward graph writes
};

StageGraphs::StageGraphs(Backbone& backbone, int64_t begin_block, int64_t end_block,
                         std::optional<torch::ScalarType> autocast,
                         std::vector<torch::Tensor> params, bool input_grad, bool float32_output,
                         std::vector<SlotUse> slots)
    : backbone_(backbone),
      begin_(begin_block),
      end_(end_block),
      autocast_(autocast),
      params_(std::move(params)),
      input_grad_(input_grad),
      float32_output_(float32_output),
      uses_(std::move(slots)) {
#ifndef MYRIAD_WITH_CUDA
  MYRIAD_THROW("CUDA graphs need a build with CUDA");
#endif
  MYRIAD_CHECK(!uses_.empty(), "CUDA graphs of a stage need at least one slot");
}

StageGraphs::~StageGraphs() = default;

Activations StageGraphs::run(const Activations& in) const {
  const AutocastGuard autocast(in.x.device(), autocast_);
  Activations out = backbone_.forward_blocks(in, begin_, end_);
  if (float32_output_) out.x = out.x.to(torch::kFloat32);
  return out;
}

namespace {

bool same_layout(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.strides() == b.strides() &&
                          a.scalar_type() == b.scalar_type());
}

}  // namespace

bool StageGraphs::recorded_for(const Activations& in) const {
  if (slots_.empty()) return false;
  const Activations& have = slots_.front()->in;
  return same_layout(have.x, in.x) && same_layout(have.keys, in.keys) &&
         same_layout(have.restore, in.restore);
}

#ifdef MYRIAD_WITH_CUDA

namespace {

// Eager runs before recording: the first picks cuDNN's algorithms, the second runs as the graph
// will.
constexpr int kWarmups = 2;

torch::Tensor static_copy(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone(torch::MemoryFormat::Preserve) : t;
}

// The batch-norm statistics of blocks [begin, end), put back at the end of the scope.
class BuffersKept {
 public:
  BuffersKept(Backbone& backbone, int64_t begin, int64_t end) {
    for (const auto& item : backbone.named_buffers()) {
      const int64_t block = backbone.block_of(item.key());
      if (begin <= block && block < end) kept_.emplace_back(item.value(), item.value().clone());
    }
  }
  ~BuffersKept() {
    torch::NoGradGuard no_grad;
    for (auto& [buffer, saved] : kept_) buffer.copy_(saved);
  }
  BuffersKept(const BuffersKept&) = delete;
  BuffersKept& operator=(const BuffersKept&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> kept_;
};

// The test fault point's memory cap (fault_graph_memory_fraction) for the scope.
class FaultMemoryCap {
 public:
  explicit FaultMemoryCap(c10::DeviceIndex device)
      : device_(device), fraction_(fault_graph_memory_fraction()) {
    if (fraction_) c10::cuda::CUDACachingAllocator::setMemoryFraction(*fraction_, device_);
  }
  ~FaultMemoryCap() {
    if (fraction_) c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, device_);
  }
  FaultMemoryCap(const FaultMemoryCap&) = delete;
  FaultMemoryCap& operator=(const FaultMemoryCap&) = delete;

 private:
  c10::DeviceIndex device_;
  std::optional<double> fraction_;
};

std::string first_line(const char* text) {
  const std::string s = text;
  return s.substr(0, s.find('\n'));
}

}  // namespace

bool StageGraphs::prepare(const Activations& in, GradientSynchronizer& sync) {
  if (recorded_for(in)) return true;
  if (!slots_.empty()) {
    log_warn("CUDA graphs: a micro-batch of {} after {}: recording the stage again", in.x.sizes(),
             slots_.front()->in.x.sizes());
    slots_.clear();
  }
  std::string failure;
  try {
    record_all(in, sync);
  } catch (const c10::OutOfMemoryError& e) {
    failure = first_line(e.what());
  }
  // The ranks that sum this stage's gradients must all replay, or none: their recorded
  // all-reduces pair with each other.
  if (sync.all_agree(failure.empty())) return true;
  slots_.clear();
  c10::cuda::CUDACachingAllocator::emptyCache();
  log_warn(
      "CUDA graphs: recording blocks [{}, {}) ran out of memory{}{}; the stage runs eagerly, as "
      "with --cuda-graphs off",
      begin_, end_, failure.empty() ? " on another rank" : ": ", failure);
  return false;
}

void StageGraphs::record_all(const Activations& in, GradientSynchronizer& sync) {
  const torch::Device device = in.x.device();
  MYRIAD_CHECK(device.is_cuda(), "CUDA graphs need a CUDA device, not {}", device.str());
  const auto start = std::chrono::steady_clock::now();
  all_reduces_last_ = sync.can_record_all_reduce();
  recorded_with_ = sync.share();
  {
    // The warm-up trains nothing: the stage's batch-norm statistics are put back afterwards, and
    // the gradient buckets ignore it.
    const BuffersKept buffers(backbone_, begin_, end_);
    const GradientSynchronizer::PausedHooks paused(sync);
    const AutocastCacheOff cache_off;
    const SideStream side(device.index());
    Activations sample{static_copy(in.x).requires_grad_(input_grad_), in.keys, in.restore};
    for (int w = 0; w < kWarmups; ++w) {
      const Activations out = run(sample);
      torch::autograd::backward({out.x}, {torch::ones_like(out.x)}, false, false, params_);
    }
    for (torch::Tensor& p : params_) p.mutable_grad().reset();
    sample = {};
    // What the warm-ups (and under --cuda-graphs auto the eager trial steps) left cached goes
    // back, for the graphs' pools to take. The peak then starts again: the run reports what the
    // allocator holds from here on, not the eager steps' cache that it has just returned (which
    // made auto's r50 peak 19.9 GiB against 12.6 under --cuda-graphs on).
    c10::cuda::CUDACachingAllocator::emptyCache();
    reset_peak_device_memory(device);
    const FaultMemoryCap cap(device.index());
    for (size_t s = 0; s < uses_.size(); ++s) {
      slots_.push_back(std::make_unique<Slot>());
      record(*slots_.back(), in, sync);
    }
  }
  log_info(
      "CUDA graphs: blocks [{}, {}) recorded for micro-batches of {} in {:.1f} s ({} slot(s), "
      "the gradient all-reduce {})",
      begin_, end_, in.x.sizes(), seconds_since(start), uses_.size(),
      all_reduces_last_ ? "inside the last backward, overlapped" : "after the last backward");
}

void StageGraphs::record(Slot& slot, const Activations& in, GradientSynchronizer& sync) {
  const SlotUse& use = uses_[slots_.size() - 1];
  const c10::DeviceIndex device = in.x.device().index();
  slot.in = {static_copy(in.x).requires_grad_(input_grad_), static_copy(in.keys),
             static_copy(in.restore)};
  std::vector<torch::Tensor> inputs = params_;
  if (input_grad_) inputs.push_back(slot.in.x);
  {
    Capture capture(slot.forward, device);
    slot.out = run(slot.in);
    capture.end();
  }
  slot.output_grad = torch::empty_like(slot.out.x);
  // One backward graph per use; the first of two keeps the autograd graph for the second.
  const auto record_backward = [&](at::cuda::CUDAGraph& graph, torch::Tensor& input_grad, bool last,
                                   bool retain) {
    GradientSynchronizer::GraphBackward summing(sync, last && all_reduces_last_);
    Capture capture(graph, device, slot.forward.pool());
    torch::autograd::backward({slot.out.x}, {slot.output_grad}, retain, false, inputs);
    summing.join();
    capture.end();
    if (input_grad_) {
      input_grad = slot.in.x.grad();
      slot.in.x.mutable_grad().reset();
    }
  };
  if (use.other_passes) record_backward(slot.backward, slot.input_grad, false, use.last_pass);
  if (use.last_pass) record_backward(slot.backward_last, slot.input_grad_last, true, false);
  slot.out = {slot.out.x.detach(), slot.out.keys, slot.out.restore};
}

Activations StageGraphs::forward(int slot_index, const Activations& in) {
  Slot& slot = *slots_.at(static_cast<size_t>(slot_index));
  {
    torch::NoGradGuard no_grad;
    slot.in.x.copy_(in.x);
    if (in.keys.defined()) slot.in.keys.copy_(in.keys);
    if (in.restore.defined()) slot.in.restore.copy_(in.restore);
  }
  slot.forward.replay();
  return slot.out;
}

torch::Tensor StageGraphs::backward(int slot_index, const torch::Tensor& output_grad,
                                    bool last_pass) {
  Slot& slot = *slots_.at(static_cast<size_t>(slot_index));
  const SlotUse& use = uses_.at(static_cast<size_t>(slot_index));
  MYRIAD_CHECK(last_pass ? use.last_pass : use.other_passes,
               "CUDA graphs: slot {} has no backward recorded for {} pass", slot_index,
               last_pass ? "the step's last" : "a step's earlier");
  {
    torch::NoGradGuard no_grad;
    slot.output_grad.copy_(output_grad);
  }
  if (last_pass) {
    slot.backward_last.replay();
    return slot.input_grad_last;
  }
  slot.backward.replay();
  return slot.input_grad;
}

#else

// Unreachable: the constructor refuses a build without CUDA.
bool StageGraphs::prepare(const Activations&, GradientSynchronizer&) {
  return false;
}
void StageGraphs::record_all(const Activations&, GradientSynchronizer&) {}
void StageGraphs::record(Slot&, const Activations&, GradientSynchronizer&) {}
Activations StageGraphs::forward(int, const Activations&) {
  return {};
}
torch::Tensor StageGraphs::backward(int, const torch::Tensor&, bool) {
  return {};
}

#endif

}  // namespace myriad
