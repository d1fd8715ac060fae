#include "myriad/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "myriad/comm/communicator.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/stage_graphs.h"
#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/log.h"
#include "myriad/util/phase_timer.h"
#include "myriad/util/timeline.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "graph_capture.h"
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

const char* schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::k1F1B ? "1f1b" : "gpipe";
}

std::vector<int64_t> micro_batches_in_flight(PipelineSchedule schedule, int stages,
                                             int micro_batches) {
  std::vector<int64_t> in_flight(static_cast<size_t>(stages), micro_batches);
  if (schedule == PipelineSchedule::k1F1B) {
    for (int s = 0; s < stages; ++s) in_flight[s] = std::min(stages - s, micro_batches);
  }
  return in_flight;
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
    std::unique_ptr<AutocastGuard> guard;
    if (autocast) guard = std::make_unique<AutocastGuard>(device, *autocast);
    Activations out = backbone.forward_blocks(input, 0, backbone.num_blocks());
    guard.reset();
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
  const Activations input{backbone.in_layout(sample.x.to(device)),
                          sample.keys.defined() ? sample.keys.to(device) : sample.keys,
                          sample.restore};
  Activations in = input;
  for (int64_t b = 0; b < backbone.num_blocks(); ++b) {
    move_blocks(backbone, b, b + 1, device);
    const auto run = [&](bool keep_graph) {
      Activations x = in;
      if (b > 0) x.x = in.x.detach().requires_grad_(true);
      std::unique_ptr<AutocastGuard> guard;
      if (autocast) guard = std::make_unique<AutocastGuard>(device, *autocast);
      // As a stage runs it: with activation checkpointing a middle block keeps only its input
      // and computes its forward again in backward.
      Activations out = backbone.forward_blocks(x, b, b + 1);
      guard.reset();
      if (keep_graph) return out;
      out.x.backward(torch::ones_like(out.x));
      return out;
    };
    run(false);  // warm-up: kernels chosen, memory pools grown
    wait_for(device);
    // The host's launches alone, then with the device's work waited for: the first is what an
    // eager stage's host spends on the block, the second stands for the device's time where no
    // graph can time it.
    const auto start = Clock::now();
    for (int r = 0; r < kRepeats; ++r) run(false);
    BlockCost& cost = costs[static_cast<size_t>(b)];
    cost.launch_seconds = seconds_since(start) / kRepeats;
    wait_for(device);
    cost.device_seconds = seconds_since(start) / kRepeats;
    Activations out;
#ifdef MYRIAD_WITH_CUDA
    if (device.is_cuda()) {
      cost.device_seconds =
          replay_seconds([&] { run(false); }, kRepeats, cost.device_seconds, device);
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
  // Every block is on the device now.
  if (const std::optional<double> chain =
          chained_launch_seconds(backbone, input, device, autocast, kRepeats)) {
    double alone = 0.0;
    for (const BlockCost& cost : costs) alone += cost.launch_seconds;
    log_info(
        "pipeline profile: the whole backbone launched in {:.2f} ms, its blocks alone in "
        "{:.2f} ms",
        1e3 * *chain, 1e3 * alone);
    costs = chained_launches(std::move(costs), *chain);
    // On the CPU the host is the device: its blocks take what the chain says there too.
    if (!device.is_cuda()) {
      for (BlockCost& cost : costs) cost.device_seconds = cost.launch_seconds;
    }
  }
  for (const torch::Tensor& p : backbone.parameters()) p.mutable_grad().reset();
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

// Where a stage before the last runs its classifier parts under 1F1B: a high-priority stream of
// its own. Every rank takes part in part m, and the last stage runs it between m's forward and
// backward. Queued on the first stage's stream, it waited there behind that stage's next forward:
// 7-8 ms a micro-batch of r200 at P = 2 on H200s, a bubble of 0.42 instead of GPipe's 0.15. On a
// stream of its own it runs beside that forward. Each part runs after the stage's work queued up
// to the latest mark (the step's start: the rows begin_parts chose, the last update; then each
// transfer), and the stage's stream waits for the part (join) only before its next transfer or
// the step's end, not at once: a part is queued before the stage's next forward (one_f_one_b),
// which must not wait for it. So no NCCL kernel of one communicator waits on this GPU beside one
// of another that it depends on through the other ranks: NCCL does not promise that two such
// kernels run at once.
class PipelineEngine::PartsStream {
 public:
#ifdef MYRIAD_WITH_CUDA
  explicit PartsStream(c10::DeviceIndex device)
      : device_(device), parts_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)) {}
  // The parts queued from now on run after everything the stage has queued so far.
  void mark() {
    marked_.record(c10::cuda::getCurrentCUDAStream(device_));
  }
  void run(const std::function<void()>& part) {
    marked_.block(parts_);
    {
      const c10::cuda::CUDAStreamGuard on_parts(parts_);
      part();
    }
    joined_ = false;
  }
  // The stage's stream waits for the parts queued so far.
  void join() {
    if (joined_) return;
    wait_for_stream(c10::cuda::getCurrentCUDAStream(device_), parts_);
    joined_ = true;
  }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream parts_;
  at::cuda::CUDAEvent marked_;
  bool joined_ = true;
#else
  // The host runs a CPU stage's work in order: there is nothing to run beside.
  void mark() {}
  void run(const std::function<void()>& part) {
    part();
  }
  void join() {}
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
#ifdef MYRIAD_WITH_CUDA
  if (layout_.schedule == PipelineSchedule::k1F1B && !layout_.last() && device_.is_cuda())
    parts_stream_ = std::make_unique<PartsStream>(device_.index());
#endif
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::keep_parts_in_stream() {
  parts_stream_.reset();
}

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
  const Timeline::Scope traced(timeline_, "send");
  if (parts_stream_) parts_stream_->join();
  count_sent(tensors);
  pipe_->send(tensors, peer);
  if (parts_stream_) parts_stream_->mark();
}

std::vector<torch::Tensor> PipelineEngine::recv(const std::vector<torch::ScalarType>& dtypes,
                                                int peer) {
  const Timeline::Scope traced(timeline_, "receive");
  if (parts_stream_) parts_stream_->join();
  std::vector<torch::Tensor> got = pipe_->recv(dtypes, peer);
  if (parts_stream_) parts_stream_->mark();
  return got;
}

std::vector<torch::Tensor> PipelineEngine::exchange(const std::vector<torch::Tensor>& tensors,
                                                    const std::vector<torch::ScalarType>& dtypes,
                                                    int peer) {
  const Timeline::Scope traced(timeline_, "exchange");
  if (parts_stream_) parts_stream_->join();
  count_sent(tensors);
  std::vector<torch::Tensor> got = pipe_->exchange(tensors, dtypes, peer);
  if (parts_stream_) parts_stream_->mark();
  return got;
}

void PipelineEngine::count_sent(const std::vector<torch::Tensor>& tensors) {
  for (const torch::Tensor& t : tensors) bytes_sent_ += static_cast<double>(tensor_bytes(t));
}

void PipelineEngine::phase(const char* name) {
  if (timer_ != nullptr) timer_->mark(name);
}

torch::Tensor PipelineEngine::route_labels(const torch::Tensor& labels) {
  if (layout_.stages == 1) return labels;
  const int last = layout_.stages - 1;
  const torch::Tensor none = torch::empty({0}, torch::dtype(torch::kInt64).device(device_));
  if (layout_.first()) {
    send({labels.to(device_, torch::kInt64).contiguous()}, last);
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
  micro_batches_.assign(static_cast<size_t>(m_count), MicroBatch{});
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

torch::Tensor PipelineEngine::part_labels(int m) const {
  return layout_.last() ? label_parts_[m] : torch::Tensor();
}

Activations PipelineEngine::local_input(int m) const {
  return {backbone_.in_layout(image_parts_[m]), key_parts_[m], torch::Tensor()};
}

Activations PipelineEngine::received_input(std::vector<torch::Tensor> got) const {
  return {from_wire(backbone_, got[0]).requires_grad_(true), std::move(got[1]), std::move(got[2])};
}

Activations PipelineEngine::receive_forward(int m) {
  return layout_.first() ? local_input(m)
                         : received_input(recv(kActivationDtypes, layout_.stage - 1));
}

std::vector<torch::Tensor> PipelineEngine::forward_micro_batch(int m, Activations in) {
  phase("forward");
  MicroBatch& mb = micro_batches_[m];
  Activations out;
  const Timeline::Scope traced(timeline_, "forward", m);
  clock_->start();
  if (graphs_ && !graphs_->prepare(in, *step_sync_)) use_cuda_graphs(false);
  if (graphs_) {
    out = graphs_->forward(m % graph_slots_, in);
  } else {
    if (!layout_.first()) mb.input = in.x;
    std::unique_ptr<AutocastGuard> guard;
    if (autocast_) guard = std::make_unique<AutocastGuard>(device_, *autocast_);
    out = backbone_.forward_blocks(std::move(in), layout_.begin_block(), layout_.end_block());
  }
  clock_->stop();
  if (layout_.last()) {
    mb.output = out.x.to(torch::kFloat32);  // the graphs' output already is
    return {};
  }
  mb.output = out.x;
  return {to_wire(backbone_, out.x), out.keys, out.restore};
}

torch::Tensor PipelineEngine::run_classifier(int part, const torch::Tensor& output,
                                             const torch::Tensor& labels,
                                             const ClassifierStep& classify, torch::Tensor& loss) {
  const auto add = [&loss](const torch::Tensor& part_loss) {
    loss = loss.defined() ? loss + part_loss : part_loss;
  };
  if (!layout_.last()) {
    // No samples here, but this rank's classes: its share of the classifier's work.
    const auto share = [&] {
      const Timeline::Scope traced(timeline_, "classifier", part,
                                   parts_stream_ ? Timeline::Lane::kParts : Timeline::Lane::kStage);
      add(classify(torch::empty({0, embedding_size_}, torch::dtype(torch::kFloat32).device(device_))
                       .requires_grad_(true),
                   torch::empty({0}, torch::dtype(torch::kInt64).device(device_))));
    };
    if (!parts_stream_) {
      share();
      return torch::Tensor();
    }
    // The timer's boundaries are events on the stage's stream: the part, beside it, is not timed.
    const PhaseTimer::Paused untimed(timer_);
    parts_stream_->run(share);
    return torch::Tensor();
  }
  const torch::Tensor embeddings = output.detach().requires_grad_(true);
  {
    const Timeline::Scope traced(timeline_, "classifier", part);
    add(classify(embeddings, labels));
  }
  MYRIAD_CHECK(embeddings.grad().defined(),
               "the classifier left the embeddings without a gradient: it must run backward");
  return embeddings.grad();
}

torch::Tensor PipelineEngine::backward_micro_batch(int m, const torch::Tensor& grad,
                                                   GradientSynchronizer& sync, bool last_pass) {
  phase("backward");
  MicroBatch& mb = micro_batches_[m];
  const torch::Tensor incoming = layout_.last() ? grad : from_wire(backbone_, grad);
  fault_stall("backward", layout_.rank());
  torch::Tensor input_grad;
  const Timeline::Scope traced(timeline_, "backward", m);
  clock_->start();
  if (graphs_) {
    input_grad = graphs_->backward(m % graph_slots_, incoming, last_pass);
    sync.pass_replayed(last_pass, last_pass && graphs_->all_reduces_last());
  } else {
    sync.begin_pass(last_pass);
    torch::autograd::backward({mb.output}, {incoming});
    if (!layout_.first()) input_grad = mb.input.grad();
  }
  clock_->stop();
  mb = MicroBatch{};
  return layout_.first() ? torch::Tensor() : to_wire(backbone_, input_grad);
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
  torch::Tensor loss = layout_.schedule == PipelineSchedule::k1F1B ? one_f_one_b(classify, sync)
                                                                   : gpipe(classify, sync);
  micro_batches_.clear();
  ++steps_;
  return loss;
}

void PipelineEngine::use_cuda_graphs(bool on) {
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
  // Micro-batch m runs in slot m % slots; the step's last backward pass is GPipe's first
  // micro-batch and 1F1B's last.
  const int last = layout_.schedule == PipelineSchedule::k1F1B ? m_count - 1 : 0;
  std::vector<StageGraphs::SlotUse> uses(static_cast<size_t>(slots));
  for (int m = 0; m < m_count; ++m) {
    StageGraphs::SlotUse& use = uses[static_cast<size_t>(m % slots)];
    (m == last ? use.last_pass : use.other_passes) = true;
  }
  return std::make_unique<StageGraphs>(backbone_, layout_.begin_block(), layout_.end_block(),
                                       autocast_, stage_parameters(), !layout_.first(),
                                       layout_.last(), std::move(uses));
}

// Every forward, each micro-batch sent on as soon as it is computed; the classifier once on the
// replica's batch; every backward, last micro-batch first.
torch::Tensor PipelineEngine::gpipe(const ClassifierStep& classify, GradientSynchronizer& sync) {
  const int m_count = layout_.micro_batches;
  for (int m = 0; m < m_count; ++m) {
    const std::vector<torch::Tensor> out = forward_micro_batch(m, receive_forward(m));
    if (!layout_.last()) send(out, layout_.stage + 1);
  }
  // The classifier once, on the replica's whole batch.
  torch::Tensor output;
  if (layout_.last()) {
    std::vector<torch::Tensor> outputs;
    for (const MicroBatch& mb : micro_batches_) outputs.push_back(mb.output.detach());
    output = m_count == 1 ? outputs[0] : torch::cat(outputs);
  }
  torch::Tensor loss;
  const torch::Tensor grad = run_classifier(-1, output, labels_, classify, loss);
  const std::vector<torch::Tensor> grads =
      layout_.last() ? grad.chunk(m_count) : std::vector<torch::Tensor>();
  for (int m = m_count - 1; m >= 0; --m) {
    const torch::Tensor incoming =
        layout_.last() ? grads[m] : recv(kGradientDtypes, layout_.stage + 1)[0];
    const torch::Tensor input_grad = backward_micro_batch(m, incoming, sync, m == 0);
    if (!layout_.first()) send({input_grad}, layout_.stage - 1);
  }
  return loss;
}

// Megatron-LM's non-interleaved 1F1B: stage s runs w = min(P - s - 1, M) forwards ahead, then
// alternates one forward and one backward, then the w backwards left. The classifier of
// micro-batch m runs on every rank: on the last stage right after m's forward, and on the others
// (their share: no samples, their classes) right after the transfer that sends m's activations
// on. That is the earliest point at which every rank has passed m on, so every rank meets the
// parts and the pipeline's transfers in the same order, and it puts a share before the stage's
// next forward, not behind it: eager passes fill CUDA's launch queue, and a share queued after a
// forward left the host a whole pass behind the last stage, which waited for it. Two neighbours
// that each have something for the other (an activation forward, a gradient back) exchange it in
// one transfer, so neither waits for the other's to arrive first.
torch::Tensor PipelineEngine::one_f_one_b(const ClassifierStep& classify,
                                          GradientSynchronizer& sync) {
  const int m_count = layout_.micro_batches;
  const int warmup = std::min(layout_.stages - layout_.stage - 1, m_count);
  const int remaining = m_count - warmup;
  const int previous = layout_.stage - 1, next = layout_.stage + 1;
  if (parts_stream_) parts_stream_->mark();
  torch::Tensor loss;
  const auto share = [&](int m) {
    run_classifier(m, torch::Tensor(), torch::Tensor(), classify, loss);
  };
  for (int m = 0; m < warmup; ++m) {
    send(forward_micro_batch(m, receive_forward(m)), next);
    share(m);
  }
  Activations in;
  if (remaining > 0) in = receive_forward(warmup);
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i, b = i;
    const std::vector<torch::Tensor> out = forward_micro_batch(f, std::move(in));
    torch::Tensor incoming;
    if (layout_.last()) {
      incoming = run_classifier(b, micro_batches_[b].output, part_labels(b), classify, loss);
    } else {
      incoming = exchange(out, kGradientDtypes, next)[0];
      share(f);
    }
    const torch::Tensor input_grad = backward_micro_batch(b, incoming, sync, b == m_count - 1);
    if (i + 1 == remaining) {
      if (!layout_.first()) send({input_grad}, previous);
    } else {
      in = layout_.first() ? local_input(f + 1)
                           : received_input(exchange({input_grad}, kActivationDtypes, previous));
    }
  }
  for (int b = remaining; b < m_count; ++b) {
    const torch::Tensor incoming = recv(kGradientDtypes, next)[0];
    const torch::Tensor input_grad = backward_micro_batch(b, incoming, sync, b == m_count - 1);
    if (!layout_.first()) send({input_grad}, previous);
  }
  // What follows the step (the classifier's update, the optimizer) runs after every part.
  if (parts_stream_) parts_stream_->join();
  return loss;
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
