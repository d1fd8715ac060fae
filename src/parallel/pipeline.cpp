#include "myriad/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "myriad/comm/communicator.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/stage_graphs.h"
#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/phase_timer.h"
#include "myriad/util/timeline.h"
#include "stage_blocks.h"
#include "stage_checkpoint.h"
#include "stage_transfers.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
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

bool PipelineLayout::holds_block(int64_t b) const {
  for (int c = 0; c < chunks; ++c)
    if (begin_block(c) <= b && b < end_block(c)) return true;
  return false;
}

namespace {

using Clock = std::chrono::steady_clock;

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
    seconds_ += seconds_since(started_);
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

// What the step's actions pass on to later ones, per micro-batch and chunk (item()): a received
// input (until its forward), an output in wire form (until it is sent), its gradient (until its
// backward) and the input's gradient in wire form (until it is sent).
struct PipelineEngine::StepState {
  explicit StepState(size_t items)
      : inputs(items), outputs(items), grads(items), input_grads(items) {}
  std::vector<Activations> inputs;
  std::vector<std::vector<torch::Tensor>> outputs;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> input_grads;
  bool last_pass = false;  // set by kAllReduce for the backward that follows
  torch::Tensor loss;
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
      actions_(schedule_actions(layout_.schedule, layout_.stages, layout_.stage,
                                layout_.micro_batches, layout_.chunks)),
      clock_(std::make_unique<BusyClock>(device)) {
  MYRIAD_CHECK(static_cast<int>(layout_.cut.size()) == layout_.stages * layout_.chunks + 1 &&
                   layout_.cut.front() == 0 && layout_.cut.back() == backbone.num_blocks(),
               "a pipeline cut must cover the backbone's {} blocks in {} virtual stages",
               backbone.num_blocks(), layout_.stages * layout_.chunks);
  MYRIAD_CHECK(layout_.stages == 1 ||
                   (pipe_ && pipe_->size() == layout_.stages && pipe_->rank() == layout_.stage),
               "stage {} of {} needs a communicator of its pipeline's stages", layout_.stage,
               layout_.stages);
  std::unique_ptr<PartsStream> parts;
#ifdef MYRIAD_WITH_CUDA
  if (classifier_in_parts(layout_.schedule) && !layout_.last() && device_.is_cuda())
    parts = std::make_unique<PartsStream>(device_.index());
#endif
  transfers_ = std::make_unique<StageTransfers>(pipe_.get(), std::move(parts));
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::keep_parts_in_stream() {
  transfers_->drop_parts_stream();
}

void PipelineEngine::set_timeline(Timeline* timeline) {
  timeline_ = timeline;
  transfers_->set_timeline(timeline);
}

void PipelineEngine::place_stage() {
  for (int c = 0; c < layout_.chunks; ++c)
    move_blocks(backbone_, layout_.begin_block(c), layout_.end_block(c), device_);
}

bool PipelineEngine::holds(const std::string& name) const {
  return layout_.holds_block(backbone_.block_of(name));
}

size_t PipelineEngine::item(int chunk, int m) const {
  return static_cast<size_t>(chunk * layout_.micro_batches + m);
}

int PipelineEngine::traced_chunk(int chunk) const {
  return layout_.chunks > 1 ? chunk : -1;
}

StateDict PipelineEngine::stage_state() {
  StateDict state;
  for (auto& [name, tensor] : backbone_.state_dict()) {
    if (holds(name)) state.emplace_back(name, tensor);
  }
  return state;
}

std::vector<torch::Tensor> PipelineEngine::stage_parameters() {
  std::vector<torch::Tensor> params;
  for (const auto& item : backbone_.named_parameters()) {
    if (item.value().requires_grad() && holds(item.key())) params.push_back(item.value());
  }
  return params;
}

std::vector<torch::Tensor> PipelineEngine::stage_buffers() {
  std::vector<torch::Tensor> buffers;
  for (const auto& item : backbone_.named_buffers()) {
    if (holds(item.key())) buffers.push_back(item.value());
  }
  return buffers;
}

void PipelineEngine::phase(const char* name) {
  if (timer_ != nullptr) timer_->mark(name);
}

torch::Tensor PipelineEngine::route_labels(const torch::Tensor& labels) {
  if (layout_.stages == 1) return labels;
  const int last = layout_.stages - 1;
  const torch::Tensor none = torch::empty({0}, torch::dtype(torch::kInt64).device(device_));
  if (layout_.first()) {
    transfers_->send({labels.to(device_, torch::kInt64).contiguous()}, last);
    return none;
  }
  if (layout_.last()) return pipe_->recv({torch::kInt64}, 0)[0];
  return none;
}

std::vector<int64_t> PipelineEngine::part_rows(const torch::Tensor& labels) const {
  const int64_t rows = layout_.last() ? labels.size(0) : 0;
  return std::vector<int64_t>(static_cast<size_t>(layout_.micro_batches),
                              rows / layout_.micro_batches);
}

namespace {

// What travels with a micro-batch's activations: any dtype (the previous stage's compute dtype),
// then the samples' keys and ViT's masking order.
const std::vector<torch::ScalarType> kActivationDtypes = {torch::ScalarType::Undefined,
                                                          torch::kInt64, torch::kInt64};
const std::vector<torch::ScalarType> kGradientDtypes = {torch::ScalarType::Undefined};

}  // namespace

void PipelineEngine::split_step(const torch::Tensor& images, const torch::Tensor& keys,
                                const torch::Tensor& labels) {
  const int m_count = layout_.micro_batches;
  micro_batches_.assign(item(layout_.chunks, 0), MicroBatch{});
  image_parts_.clear();
  key_parts_.clear();
  label_parts_.clear();
  if (layout_.first()) {
    MYRIAD_CHECK(images.size(0) % m_count == 0, "a batch of {} cannot be cut into {} micro-batches",
                 images.size(0), m_count);
    image_parts_ = images.chunk(m_count);
    key_parts_ = keys.chunk(m_count);
  }
  labels_ = labels;
  if (layout_.last()) {
    MYRIAD_CHECK(labels.size(0) % m_count == 0, "{} labels cannot be cut into {} micro-batches",
                 labels.size(0), m_count);
    label_parts_ = labels.chunk(m_count);
  }
}

Activations PipelineEngine::local_input(int m) const {
  return {backbone_.in_layout(image_parts_[m]), key_parts_[m], torch::Tensor()};
}

Activations PipelineEngine::received_input(std::vector<torch::Tensor> got) const {
  return {from_wire(backbone_, got[0]).requires_grad_(true), std::move(got[1]), std::move(got[2])};
}

std::vector<torch::Tensor> PipelineEngine::forward_micro_batch(int chunk, int m, Activations in) {
  phase("forward");
  MicroBatch& mb = micro_batches_[item(chunk, m)];
  Activations out;
  const Timeline::Scope traced(timeline_, "forward", m, Timeline::Lane::kStage,
                               traced_chunk(chunk));
  clock_->start();
  if (graphs_ && !graphs_->prepare(in, *step_sync_)) use_cuda_graphs(false);
  if (graphs_) {
    out = graphs_->forward(m % graph_slots_, in);
  } else {
    if (!layout_.takes_images(chunk)) mb.input = in.x;
    const AutocastGuard autocast(device_, autocast_);
    out = backbone_.forward_blocks(std::move(in), layout_.begin_block(chunk),
                                   layout_.end_block(chunk));
  }
  clock_->stop();
  if (layout_.gives_embeddings(chunk)) {
    mb.output = out.x.to(torch::kFloat32);  // the graphs' output already is
    return {};
  }
  mb.output = out.x;
  return {to_wire(backbone_, out.x), out.keys, out.restore};
}

void PipelineEngine::run_classifier(int part, StepState& state, const ClassifierStep& classify) {
  const auto add = [&state](const torch::Tensor& part_loss) {
    state.loss = state.loss.defined() ? state.loss + part_loss : part_loss;
  };
  PartsStream* parts = transfers_->parts();
  if (!layout_.last()) {
    // No samples here, but this rank's classes: its share of the classifier's work.
    const auto share = [&] {
      const Timeline::Scope traced(timeline_, "classifier", part,
                                   parts ? Timeline::Lane::kParts : Timeline::Lane::kStage);
      add(classify(torch::empty({0, embedding_size_}, torch::dtype(torch::kFloat32).device(device_))
                       .requires_grad_(true),
                   torch::empty({0}, torch::dtype(torch::kInt64).device(device_))));
    };
    if (!parts) return share();
    // The timer's boundaries are events on the stage's stream: the part, beside it, is not timed.
    const PhaseTimer::Paused untimed(timer_);
    return parts->run(share);
  }
  const torch::Tensor embeddings = classifier_input(part).requires_grad_(true);
  {
    const Timeline::Scope traced(timeline_, "classifier", part);
    add(classify(embeddings, part == kWholeBatch ? labels_ : label_parts_[part]));
  }
  MYRIAD_CHECK(embeddings.grad().defined(),
               "the classifier left the embeddings without a gradient: it must run backward");
  // The gradients of the last chunk's outputs (GPipe's batch: of its only chunk's).
  const int chunk = layout_.chunks - 1;
  if (part != kWholeBatch) {
    state.grads[item(chunk, part)] = embeddings.grad();
    return;
  }
  const std::vector<torch::Tensor> grads = embeddings.grad().chunk(layout_.micro_batches);
  std::copy(grads.begin(), grads.end(), state.grads.begin());
}

torch::Tensor PipelineEngine::classifier_input(int part) const {
  if (part != kWholeBatch) return micro_batches_[item(layout_.chunks - 1, part)].output.detach();
  std::vector<torch::Tensor> outputs;
  for (const MicroBatch& mb : micro_batches_) outputs.push_back(mb.output.detach());
  return outputs.size() == 1 ? outputs[0] : torch::cat(outputs);
}

torch::Tensor PipelineEngine::backward_micro_batch(int chunk, int m, const torch::Tensor& grad,
                                                   GradientSynchronizer& sync, bool last_pass) {
  phase("backward");
  MicroBatch& mb = micro_batches_[item(chunk, m)];
  const torch::Tensor incoming =
      layout_.gives_embeddings(chunk) ? grad : from_wire(backbone_, grad);
  fault_stall("backward", layout_.rank());
  torch::Tensor input_grad;
  const Timeline::Scope traced(timeline_, "backward", m, Timeline::Lane::kStage,
                               traced_chunk(chunk));
  clock_->start();
  if (graphs_) {
    input_grad = graphs_->backward(m % graph_slots_, incoming, last_pass);
    sync.pass_replayed(last_pass, last_pass && graphs_->all_reduces_last());
  } else {
    sync.begin_pass(last_pass);
    torch::autograd::backward({mb.output}, {incoming});
    if (!layout_.takes_images(chunk)) input_grad = mb.input.grad();
  }
  clock_->stop();
  mb = MicroBatch{};
  return layout_.takes_images(chunk) ? torch::Tensor() : to_wire(backbone_, input_grad);
}

torch::Tensor PipelineEngine::train_step(const torch::Tensor& images, const torch::Tensor& keys,
                                         const torch::Tensor& labels,
                                         const ClassifierStep& classify,
                                         GradientSynchronizer& sync) {
  split_step(images, keys, labels);
  if (graphs_wanted_ && !graphs_) graphs_ = make_graphs();
  // The graphs' backward adds every pass into the buckets: they start the step at zero.
  if (graphs_) sync.zero_buckets();
  step_sync_ = &sync;
  torch::Tensor loss = run_schedule(classify, sync);
  micro_batches_.clear();
  ++steps_;
  return loss;
}

void PipelineEngine::use_cuda_graphs(bool on) {
  MYRIAD_CHECK(!on || layout_.chunks == 1,
               "CUDA graphs do not run the interleaved schedule's chunks: use --cuda-graphs off");
  graphs_wanted_ = on;
  if (on || !graphs_) return;
  graphs_.reset();
#ifdef MYRIAD_WITH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

std::unique_ptr<StageGraphs> PipelineEngine::make_graphs() {
  const int m_count = layout_.micro_batches;
  const int slots = graph_slots_ =
      static_cast<int>(micro_batches_in_flight(layout_.schedule, layout_.stages, m_count)
                           .at(static_cast<size_t>(layout_.stage)));
  // Micro-batch m runs in slot m % slots; the step's last backward pass is the schedule's.
  const auto all_reduce = std::find_if(actions_.begin(), actions_.end(), [](const Action& a) {
    return a.kind == ActionKind::kAllReduce;
  });
  MYRIAD_CHECK(all_reduce != actions_.end(), "stage {}'s schedule never all-reduces",
               layout_.stage);
  const int last = all_reduce->micro_batch;
  std::vector<StageGraphs::SlotUse> uses(static_cast<size_t>(slots));
  for (int m = 0; m < m_count; ++m) {
    StageGraphs::SlotUse& use = uses[static_cast<size_t>(m % slots)];
    (m == last ? use.last_pass : use.other_passes) = true;
  }
  return std::make_unique<StageGraphs>(backbone_, layout_.begin_block(0), layout_.end_block(0),
                                       autocast_, stage_parameters(), !layout_.first(),
                                       layout_.last(), std::move(uses));
}

torch::Tensor PipelineEngine::run_schedule(const ClassifierStep& classify,
                                           GradientSynchronizer& sync) {
  StepState state(item(layout_.chunks, 0));
  if (PartsStream* parts = transfers_->parts()) parts->mark();
  for (const Action& action : actions_) run_action(action, state, classify, sync);
  // What follows the step (the classifier's update, the optimizer) runs after every part.
  if (PartsStream* parts = transfers_->parts()) parts->join();
  return state.loss;
}

void PipelineEngine::run_action(const Action& a, StepState& state, const ClassifierStep& classify,
                                GradientSynchronizer& sync) {
  const int previous = layout_.previous_stage();
  const int next = layout_.next_stage();
  const size_t x = a.micro_batch == kWholeBatch ? 0 : item(a.chunk, a.micro_batch);
  const size_t received = a.received < 0 ? 0 : item(a.received_chunk, a.received);
  const auto take = [](auto& slot) { return std::exchange(slot, {}); };
  switch (a.kind) {
    case ActionKind::kRecvActivation:
      state.inputs[x] = received_input(transfers_->recv(kActivationDtypes, previous));
      return;
    case ActionKind::kForward:
      state.outputs[x] = forward_micro_batch(
          a.chunk, a.micro_batch,
          layout_.takes_images(a.chunk) ? local_input(a.micro_batch) : take(state.inputs[x]));
      return;
    case ActionKind::kSendActivation:
      transfers_->send(take(state.outputs[x]), next);
      return;
    case ActionKind::kSendActivationRecvGradient:
      state.grads[received] =
          transfers_->exchange(take(state.outputs[x]), kGradientDtypes, next)[0];
      return;
    case ActionKind::kClassifier:
      run_classifier(a.micro_batch, state, classify);
      return;
    case ActionKind::kRecvGradient:
      state.grads[x] = transfers_->recv(kGradientDtypes, next)[0];
      return;
    case ActionKind::kAllReduce:
      state.last_pass = true;
      return;
    case ActionKind::kBackward:
      state.input_grads[x] = backward_micro_batch(a.chunk, a.micro_batch, take(state.grads[x]),
                                                  sync, std::exchange(state.last_pass, false));
      return;
    case ActionKind::kSendGradient:
      transfers_->send({take(state.input_grads[x])}, previous);
      return;
    case ActionKind::kSendGradientRecvActivation:
      state.inputs[received] = received_input(
          transfers_->exchange({take(state.input_grads[x])}, kActivationDtypes, previous));
      return;
  }
}

torch::Tensor PipelineEngine::infer(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  const int previous = layout_.previous_stage();
  const int next = layout_.next_stage();
  // The batch passes every chunk in turn: interleaved, through every stage once per chunk.
  for (int c = 0; c < layout_.chunks; ++c) {
    Activations in;
    if (layout_.takes_images(c)) {
      in = {backbone_.in_layout(images), torch::Tensor(), torch::Tensor()};
    } else {
      std::vector<torch::Tensor> got = pipe_->recv(kActivationDtypes, previous);
      in = {from_wire(backbone_, got[0]), got[1], got[2]};
    }
    Activations out;
    {
      const AutocastGuard autocast(device_, autocast_);
      out = backbone_.forward_blocks(std::move(in), layout_.begin_block(c), layout_.end_block(c));
    }
    if (layout_.gives_embeddings(c)) return out.x.to(torch::kFloat32);
    pipe_->send({to_wire(backbone_, out.x), out.keys, out.restore}, next);
  }
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
  return layout_.stages == 1
             ? std::vector<NamedParamState>()
             : gather_stages_for_save(layout_, backbone_, *pipe_, optimizer, device_);
}

PipelineTimes PipelineEngine::take_times() {
  PipelineTimes times{clock_->take(), transfers_->take_bytes_sent(), steps_};
  steps_ = 0;
  return times;
}

}  // namespace myriad
