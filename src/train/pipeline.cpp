#include "myriad/train/pipeline.h"

#include <chrono>
#include <cmath>
#include <map>

#include "myriad/comm/communicator.h"
#include "myriad/train/gradient_sync.h"
#include "myriad/util/autocast.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

PipelineLayout pipeline_layout(int world, int rank, int stages, int micro_batches) {
  MYRIAD_CHECK_COLLECTIVE(stages >= 1 && world % stages == 0,
                          "--pipeline-stages {} does not divide the {} ranks", stages, world);
  MYRIAD_CHECK_COLLECTIVE(micro_batches >= 1, "--micro-batches must be positive");
  PipelineLayout layout;
  layout.stages = stages;
  layout.replicas = world / stages;
  layout.stage = rank % stages;
  layout.replica = rank / stages;
  layout.micro_batches = micro_batches;
  return layout;
}

std::vector<int64_t> gpipe_in_flight(int stages, int micro_batches) {
  return std::vector<int64_t>(static_cast<size_t>(stages), micro_batches);
}

namespace {

using Clock = std::chrono::steady_clock;

// Whether state-dict entry `name` lies in blocks [begin, end).
bool in_blocks(const Backbone& backbone, const std::string& name, int64_t begin, int64_t end) {
  const int64_t b = backbone.block_of(name);
  return begin <= b && b < end;
}

// Moves the state of blocks [begin, end) to `device` (parameters keep their identity).
void move_blocks(Backbone& backbone, int64_t begin, int64_t end, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : backbone.state_dict()) {
    if (in_blocks(backbone, name, begin, end) && tensor.device() != device)
      tensor.set_data(tensor.to(device));
  }
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

void wait_for(const torch::Device& device) {
  synchronize_device(device);
}

// Activations go between stages as dense buffers whose order the receiver knows. A channels-last
// backbone's [N, C, H, W] maps travel as their [N, H, W, C] view, which is dense without a copy
// (and comes back as a channels-last view), rather than being transposed twice per transfer.
torch::Tensor to_wire(const Backbone& backbone, const torch::Tensor& x) {
  if (!x.defined()) return x;
  return backbone.channels_last() && x.dim() == 4 ? x.permute({0, 2, 3, 1}).contiguous()
                                                  : x.contiguous();
}
torch::Tensor from_wire(const Backbone& backbone, const torch::Tensor& x) {
  return backbone.channels_last() && x.dim() == 4 ? x.permute({0, 3, 1, 2}) : x;
}

}  // namespace

std::vector<BlockCost> profile_blocks(Backbone& backbone, const Activations& sample,
                                      const torch::Device& device,
                                      std::optional<torch::ScalarType> autocast,
                                      double state_factor) {
  constexpr int kRepeats = 3;
  // Profiling trains nothing: buffers (batch-norm statistics) are put back afterwards.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;
  for (const auto& b : backbone.named_buffers()) buffers.emplace_back(b.value(), b.value().clone());
  std::map<std::string, torch::Device> homes;
  for (auto& [name, tensor] : backbone.state_dict()) homes.emplace(name, tensor.device());

  std::vector<BlockCost> costs(static_cast<size_t>(backbone.num_blocks()));
  Activations in{backbone.in_layout(sample.x.to(device)),
                 sample.keys.defined() ? sample.keys.to(device) : sample.keys, sample.restore};
  for (int64_t b = 0; b < backbone.num_blocks(); ++b) {
    move_blocks(backbone, b, b + 1, device);
    const auto run = [&](bool keep_graph) {
      Activations x = in;
      if (b > 0) x.x = in.x.detach().requires_grad_(true);
      std::unique_ptr<AutocastGuard> guard;
      if (autocast) guard = std::make_unique<AutocastGuard>(device, *autocast);
      Activations out = backbone.forward_block(b, x);
      guard.reset();
      if (keep_graph) return out;
      out.x.backward(torch::ones_like(out.x));
      return out;
    };
    run(false);  // warm-up: kernels chosen, memory pools grown
    wait_for(device);
    const auto start = Clock::now();
    for (int r = 0; r < kRepeats; ++r) run(false);
    wait_for(device);
    BlockCost& cost = costs[static_cast<size_t>(b)];
    cost.seconds = std::chrono::duration<double>(Clock::now() - start).count() / kRepeats;
    Activations out;
#ifdef MYRIAD_WITH_CUDA
    if (device.is_cuda()) {
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
    for (const torch::Tensor& p : backbone.parameters()) p.mutable_grad().reset();
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [buffer, saved] : buffers) buffer.copy_(saved);
    for (auto& [name, tensor] : backbone.state_dict()) {
      const torch::Device home = homes.at(name);
      if (tensor.device() != home) tensor.set_data(tensor.to(home));
    }
  }
  return costs;
}

// The time a stage computes, without its waits: CUDA events around each region on GPUs (read
// when the times are taken), the host clock on the CPU.
class PipelineEngine::BusyClock {
 public:
  explicit BusyClock(const torch::Device& device) : device_(device) {}
  void start() {
#ifdef MYRIAD_WITH_CUDA
    if (device_.is_cuda()) {
      events_.emplace_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault),
                           std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
      events_.back().first->record(c10::cuda::getCurrentCUDAStream(device_.index()));
      return;
    }
#endif
    started_ = Clock::now();
  }
  void stop() {
#ifdef MYRIAD_WITH_CUDA
    if (device_.is_cuda()) {
      events_.back().second->record(c10::cuda::getCurrentCUDAStream(device_.index()));
      return;
    }
#endif
    seconds_ += std::chrono::duration<double>(Clock::now() - started_).count();
  }
  double take() {
#ifdef MYRIAD_WITH_CUDA
    for (auto& [a, b] : events_) {
      b->synchronize();
      seconds_ += a->elapsed_time(*b) / 1e3;
    }
    events_.clear();
#endif
    const double s = seconds_;
    seconds_ = 0.0;
    return s;
  }

 private:
  torch::Device device_;
  Clock::time_point started_;
  double seconds_ = 0.0;
#ifdef MYRIAD_WITH_CUDA
  std::vector<std::pair<std::unique_ptr<at::cuda::CUDAEvent>, std::unique_ptr<at::cuda::CUDAEvent>>>
      events_;
#endif
};

// One micro-batch's ends on this stage: its input (a leaf that requires grad, past the first
// stage) and its output, whose graph backward() runs.
struct PipelineEngine::MicroBatch {
  torch::Tensor input;
  torch::Tensor output;
};

PipelineEngine::PipelineEngine(PipelineLayout layout, Backbone& backbone,
                               std::unique_ptr<Communicator> pipe, const torch::Device& device,
                               std::optional<torch::ScalarType> autocast, int64_t embedding_size)
    : layout_(std::move(layout)),
      backbone_(backbone),
      pipe_(std::move(pipe)),
      device_(device),
      autocast_(autocast),
      embedding_size_(embedding_size),
      clock_(std::make_unique<BusyClock>(device)) {
  MYRIAD_CHECK(static_cast<int>(layout_.cut.size()) == layout_.stages + 1 &&
                   layout_.cut.front() == 0 && layout_.cut.back() == backbone.num_blocks(),
               "a pipeline cut must cover the backbone's {} blocks", backbone.num_blocks());
  MYRIAD_CHECK(layout_.stages == 1 ||
                   (pipe_ && pipe_->size() == layout_.stages && pipe_->rank() == layout_.stage),
               "stage {} of {} needs a communicator of its pipeline's stages", layout_.stage,
               layout_.stages);
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::place_stage() {
  move_blocks(backbone_, layout_.begin_block(), layout_.end_block(), device_);
}

StateDict PipelineEngine::stage_state() {
  StateDict state;
  for (auto& [name, tensor] : backbone_.state_dict()) {
    if (in_blocks(backbone_, name, layout_.begin_block(), layout_.end_block()))
      state.emplace_back(name, tensor);
  }
  return state;
}

std::vector<torch::Tensor> PipelineEngine::stage_parameters() {
  std::vector<torch::Tensor> params;
  for (const auto& item : backbone_.named_parameters()) {
    if (item.value().requires_grad() &&
        in_blocks(backbone_, item.key(), layout_.begin_block(), layout_.end_block()))
      params.push_back(item.value());
  }
  return params;
}

std::vector<torch::Tensor> PipelineEngine::stage_buffers() {
  std::vector<torch::Tensor> buffers;
  for (const auto& item : backbone_.named_buffers()) {
    if (in_blocks(backbone_, item.key(), layout_.begin_block(), layout_.end_block()))
      buffers.push_back(item.value());
  }
  return buffers;
}

void PipelineEngine::send(const std::vector<torch::Tensor>& tensors, int peer) {
  for (const torch::Tensor& t : tensors) bytes_sent_ += static_cast<double>(tensor_bytes(t));
  pipe_->send(tensors, peer);
}

torch::Tensor PipelineEngine::route_labels(const torch::Tensor& labels) {
  if (layout_.stages == 1) return labels;
  const int last = layout_.stages - 1;
  if (layout_.first()) {
    send({labels.to(device_, torch::kInt64).contiguous()}, last);
    return torch::Tensor();
  }
  if (layout_.last()) return pipe_->recv({torch::kInt64}, 0)[0];
  return torch::Tensor();
}

torch::Tensor PipelineEngine::forward(const torch::Tensor& images, const torch::Tensor& keys) {
  const int m_count = layout_.micro_batches;
  micro_batches_.assign(static_cast<size_t>(m_count), MicroBatch{});
  std::vector<torch::Tensor> image_parts, key_parts;
  if (layout_.first()) {
    MYRIAD_CHECK(images.size(0) % m_count == 0, "a batch of {} cannot be cut into {} micro-batches",
                 images.size(0), m_count);
    image_parts = images.chunk(m_count);
    key_parts = keys.chunk(m_count);
  }
  std::vector<torch::Tensor> embeddings;
  for (int m = 0; m < m_count; ++m) {
    Activations in;
    if (layout_.first()) {
      in = {backbone_.in_layout(image_parts[m]), key_parts[m], torch::Tensor()};
    } else {
      // The activations come in the dtype the previous stage computed them in.
      std::vector<torch::Tensor> got = pipe_->recv(
          {torch::ScalarType::Undefined, torch::kInt64, torch::kInt64}, layout_.stage - 1);
      in = {from_wire(backbone_, got[0]).requires_grad_(true), got[1], got[2]};
      micro_batches_[m].input = in.x;
    }
    Activations out;
    {
      std::unique_ptr<AutocastGuard> guard;
      if (autocast_) guard = std::make_unique<AutocastGuard>(device_, *autocast_);
      clock_->start();
      out = backbone_.forward_blocks(std::move(in), layout_.begin_block(), layout_.end_block());
      clock_->stop();
    }
    if (layout_.last()) {
      micro_batches_[m].output = out.x.to(torch::kFloat32);
      embeddings.push_back(micro_batches_[m].output.detach());
    } else {
      micro_batches_[m].output = out.x;
      send({to_wire(backbone_, out.x), out.keys, out.restore}, layout_.stage + 1);
    }
  }
  ++steps_;
  if (!layout_.last()) {
    return torch::empty({0, embedding_size_}, torch::dtype(torch::kFloat32).device(device_))
        .requires_grad_(true);
  }
  return (m_count == 1 ? embeddings[0] : torch::cat(embeddings)).requires_grad_(true);
}

void PipelineEngine::backward(const torch::Tensor& embeddings, GradientSynchronizer& sync) {
  const int m_count = layout_.micro_batches;
  std::vector<torch::Tensor> grads;
  if (layout_.last()) {
    MYRIAD_CHECK(embeddings.grad().defined(),
                 "the embeddings have no gradient: run the loss's "
                 "backward before the pipeline's");
    grads = embeddings.grad().chunk(m_count);
  }
  // Last micro-batch first; the last pass (micro-batch 0) launches the gradient all-reduces.
  for (int m = m_count - 1; m >= 0; --m) {
    MicroBatch& mb = micro_batches_[m];
    const torch::Tensor grad =
        layout_.last() ? grads[m]
                       : from_wire(backbone_, pipe_->recv({torch::ScalarType::Undefined},
                                                          layout_.stage + 1)[0]);
    sync.begin_pass(m == 0);
    clock_->start();
    torch::autograd::backward({mb.output}, {grad});
    clock_->stop();
    if (!layout_.first()) send({to_wire(backbone_, mb.input.grad())}, layout_.stage - 1);
  }
  micro_batches_.clear();
}

torch::Tensor PipelineEngine::infer(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  Activations in;
  if (layout_.first()) {
    in = {backbone_.in_layout(images), torch::Tensor(), torch::Tensor()};
  } else {
    std::vector<torch::Tensor> got = pipe_->recv(
        {torch::ScalarType::Undefined, torch::kInt64, torch::kInt64}, layout_.stage - 1);
    in = {from_wire(backbone_, got[0]), got[1], got[2]};
  }
  Activations out;
  {
    std::unique_ptr<AutocastGuard> guard;
    if (autocast_) guard = std::make_unique<AutocastGuard>(device_, *autocast_);
    out = backbone_.forward_blocks(std::move(in), layout_.begin_block(), layout_.end_block());
  }
  if (layout_.last()) return out.x.to(torch::kFloat32);
  pipe_->send({to_wire(backbone_, out.x), out.keys, out.restore}, layout_.stage + 1);
  return torch::empty({0, embedding_size_}, torch::dtype(torch::kFloat32).device(device_));
}

torch::Tensor PipelineEngine::clip_gradient_norm(const std::vector<torch::Tensor>& gradients,
                                                 double max_norm) {
  std::vector<torch::Tensor> squares;
  for (const torch::Tensor& g : gradients)
    squares.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, torch::kFloat64).square());
  torch::Tensor sum = squares.empty()
                          ? torch::zeros({1}, torch::dtype(torch::kFloat64).device(device_))
                          : torch::stack(squares).sum().reshape({1});
  if (layout_.stages > 1) pipe_->all_reduce(sum, ReduceOp::kSum);
  const torch::Tensor norm = sum.sqrt();
  const torch::Tensor factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& g : gradients) g.mul_(factor.to(g.scalar_type()));
  return norm;
}

std::vector<NamedParamState> PipelineEngine::gather_for_save(torch::optim::Optimizer& optimizer) {
  // Sent through pipe_ itself: a save's traffic is not the step's (take_times).
  std::vector<NamedParamState> gathered;
  if (layout_.stages == 1 || layout_.replica != 0) return gathered;
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const std::vector<std::string> names = adamw ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                                               : std::vector<std::string>{"momentum_buffer"};
  StateDict whole = backbone_.state_dict();
  for (int s = 1; s < layout_.stages; ++s) {
    if (layout_.stage != 0 && layout_.stage != s) continue;
    const int64_t begin = layout_.cut[s], end = layout_.cut[s + 1];
    if (layout_.stage == s) {
      // Parameters and buffers, then each parameter's state: a flag and step, then its tensors.
      std::map<std::string, NamedParamState> mine;
      for (NamedParamState& state : named_param_states(optimizer, backbone_))
        mine.emplace(state.param, std::move(state));
      for (const auto& [name, tensor] : whole) {
        if (!in_blocks(backbone_, name, begin, end)) continue;
        pipe_->send({tensor.detach().contiguous()}, 0);
        if (!tensor.requires_grad()) continue;
        const auto it = mine.find(name);
        const int64_t step = it == mine.end() ? -1 : it->second.step;
        std::vector<torch::Tensor> message(names.size() + 1);
        message[0] = torch::full({1}, step, torch::dtype(torch::kInt64).device(device_));
        for (size_t k = 0; it != mine.end() && k < it->second.tensors.size(); ++k)
          message[k + 1] = it->second.tensors[k].second.contiguous();
        pipe_->send(message, 0);
      }
      continue;
    }
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : whole) {
      if (!in_blocks(backbone_, name, begin, end)) continue;
      tensor.copy_(pipe_->recv({tensor.scalar_type()}, s)[0]);
      if (!tensor.requires_grad()) continue;
      std::vector<torch::ScalarType> dtypes = {torch::kInt64};
      for (size_t k = 0; k < names.size(); ++k) dtypes.push_back(torch::ScalarType::Undefined);
      const std::vector<torch::Tensor> message = pipe_->recv(dtypes, s);
      const int64_t step = message[0].item<int64_t>();
      if (step < 0) continue;
      NamedParamState state{name, {}, step};
      for (size_t k = 0; k < names.size(); ++k)
        state.tensors.emplace_back(names[k], message[k + 1]);
      gathered.push_back(std::move(state));
    }
  }
  return gathered;
}

PipelineTimes PipelineEngine::take_times() {
  PipelineTimes times{clock_->take(), bytes_sent_, steps_};
  bytes_sent_ = 0.0;
  steps_ = 0;
  return times;
}

}  // namespace myriad
