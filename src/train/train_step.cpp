#include "myriad/train/train_step.h"

#include <utility>
#include <vector>

#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/batch_norm.h"
#include "myriad/optim/multi_tensor_optimizer.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/train/graphs_choice.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"
#include "myriad/util/phase_timer.h"

namespace myriad {

namespace {

// CTAs per NCCL kernel of the classifier's own communicator with several stages (see
// build_classifier): one kept vit_h's first stage as fast under 1F1B as under GPipe; a second gives
// an all-gather across nodes a second channel for one more SM.
constexpr int kPipelineClassifierCtas = 2;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c,
                                                        const std::vector<torch::Tensor>& params) {
  if (c.optimizer == OptimizerKind::kAdamW) {
    return std::make_unique<MultiTensorAdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  return std::make_unique<MultiTensorSgd>(params, torch::optim::SGDOptions(c.lr)
                                                      .momentum(c.momentum)
                                                      .weight_decay(c.weight_decay)
                                                      .nesterov(c.nesterov));
}

SkippableStep& skippable(torch::optim::Optimizer& optimizer) {
  auto* step = dynamic_cast<SkippableStep*>(&optimizer);
  MYRIAD_CHECK(step != nullptr, "the backbone's optimizer cannot skip a step");
  return *step;
}

ShardedSoftmaxOptions classifier_options(const TrainConfig& c, int64_t classes) {
  ShardedSoftmaxOptions o;
  o.num_classes = classes;
  o.embedding_size = c.embedding_size;
  o.margin = c.margin;
  o.gemm_dtype = compute_dtype(c.precision);
  o.workspace_bytes = c.classifier_workspace;
  o.sample_rate = c.sample_rate;
  o.seed = c.seed;
  o.update = WeightUpdate::kFused;
  o.non_finite = c.precision == Precision::kFp16 ? NonFinitePolicy::kSkip : NonFinitePolicy::kError;
  o.optimizer.kind = c.optimizer;
  o.optimizer.lr = c.classifier_lr;
  o.optimizer.weight_decay = c.classifier_weight_decay;
  o.optimizer.momentum = c.momentum;
  o.optimizer.nesterov = c.nesterov;
  o.optimizer.state_dtype = c.classifier_state_dtype;
  o.weight_dtype = c.classifier_weight_dtype;
  o.fused_kernels = fused_kernels_choice(c.fused_classifier);
  o.fused_update = fused_update_choice(c.fused_update);
  return o;
}

template <typename T>
T take(T& part, const char* what) {
  MYRIAD_CHECK(part != nullptr, "a training step without its {}", what);
  return std::move(part);
}

}  // namespace

TrainStep::TrainStep(const TrainConfig& config, Parts parts, Communicator& comm, PhaseTimer& timer)
    : c_(config),
      fp16_(config.precision == Precision::kFp16),
      comm_(comm),
      timer_(timer),
      device_(parts.device),
      layout_(std::move(parts.layout)),
      predicted_stage_ms_(std::move(parts.predicted_stage_ms)),
      backbone_(take(parts.backbone, "backbone")),
      classifier_comm_(std::move(parts.classifier_comm)),
      classifier_(take(parts.classifier, "classifier")),
      stage_comm_(std::move(parts.stage_comm)),
      batch_norm_comm_(std::move(parts.batch_norm_comm)),
      engine_(take(parts.engine, "pipeline engine")),
      sync_(take(parts.sync, "gradient synchroniser")),
      optimizer_(take(parts.optimizer, "optimizer")),
      backbone_step_(skippable(*optimizer_)),
      buffers_(take(parts.buffers, "buffer broadcast")),
      scaler_(device_) {
  if (fp16_) classifier_->set_inverse_loss_scale(scaler_.inverse_scale());
}

void TrainStep::set_learning_rates(double factor) {
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(c_.lr * factor);
  classifier_->optimizer().set_lr(c_.classifier_lr * factor);
}

torch::Tensor TrainStep::forward_backward(const Batch& batch, const torch::Tensor& keys,
                                          const std::function<void()>& before_backward) {
  timer_.mark("forward");
  // The first stage loaded the replica's batch; the classifier needs its labels on the last.
  const torch::Tensor labels = engine_->route_labels(
      layout_.first() ? batch.labels.to(device_, /*non_blocking=*/true) : torch::Tensor());
  buffers_->broadcast();
  // The classifier on embeddings from the last stages (none from the others): the loss, and by its
  // backward their gradient.
  const auto classify = [&](const torch::Tensor& embeddings, const torch::Tensor& part_labels) {
    timer_.mark("forward");
    const torch::Tensor part_loss = classifier_->forward(embeddings, part_labels);
    timer_.mark("backward");
    before_backward();
    (fp16_ ? part_loss * scaler_.scale() : part_loss).backward();
    return part_loss;
  };
  // GPipe runs the classifier once on the replica's batch, which also updates its rows; 1F1B (and
  // interleaved) once per micro-batch, and its rows are updated once all have passed. The
  // backbone's gradients are summed over the micro-batches and, in the last backward pass, over the
  // replicas.
  const bool in_parts = classifier_in_parts(layout_.schedule);
  if (in_parts) classifier_->begin_parts(labels, engine_->part_rows(labels));
  const torch::Tensor loss = engine_->train_step(
      layout_.first() ? batch.images.to(device_, /*non_blocking=*/true) : torch::Tensor(), keys,
      labels, classify, *sync_);
  if (in_parts) classifier_->finish_parts();
  return loss;
}

torch::Tensor TrainStep::finish_gradients() {
  timer_.mark("communication");
  sync_->finish();
  timer_.mark("optimizer");
  // fp16: gradients unscaled, and a flag on the device that cancels the step on every rank if any
  // of them is not finite.
  const torch::Tensor overflow = fp16_ ? scaler_.unscale(sync_->buffers(), comm_) : torch::Tensor();
  if (c_.grad_clip > 0) engine_->clip_gradient_norm(sync_->buffers(), c_.grad_clip);
  return overflow;
}

void TrainStep::update(const torch::Tensor& overflow) {
  backbone_step_.step_unless(overflow);
  sync_->clear_gradients();
  timer_.stop();
  if (fp16_) scaler_.update(overflow);
}

TrainingState TrainStep::state() {
  TrainingState state;
  state.backbone = backbone_.get();
  state.optimizer = optimizer_.get();
  state.classifier = classifier_.get();
  state.scaler = &scaler_;
  return state;
}

TrainStepBuilder::TrainStepBuilder(const ProcessContext& context, const TrainConfig& config,
                                   const torch::Device& device, CommFactory& comms,
                                   PipelineLayout layout, int64_t classes, PhaseTimer& timer)
    : context_(context),
      c_(config),
      device_(device),
      comms_(comms),
      layout_(std::move(layout)),
      classes_(classes),
      timer_(timer),
      autocast_(autocast_dtype(config.precision)) {}

TrainStep TrainStepBuilder::build() {
  TrainStep::Parts parts;
  parts.device = device_;
  parts.layout = layout_;
  build_classifier(parts);
  build_stage(parts);
  build_gradient_parts(parts);
  return TrainStep(c_, std::move(parts), comms_.for_device(device_), timer_);
}

void TrainStepBuilder::build_classifier(TrainStep::Parts& parts) const {
  // With stages, a stage's collectives for a classifier part wait on the GPU for the last stage
  // beside the stage's own passes (1F1B), and NCCL's default CTAs per kernel then hold SMs that
  // those passes lose (docs/pipeline.md): a few CTAs move the part's small tensors as fast.
  if (layout_.stages > 1)
    parts.classifier_comm = comms_.create(device_, CommOptions{kPipelineClassifierCtas});
  Communicator& comm = parts.classifier_comm ? *parts.classifier_comm : comms_.for_device(device_);
  parts.classifier =
      std::make_unique<ShardedMarginSoftmax>(comm, classifier_options(c_, classes_), device_);
  if (!c_.init_classifier.empty()) init_classifier(*parts.classifier);
}

// The backbone, whole on every rank, and this rank's stage of it on the device (all of it with one
// stage), with the communicators of its pipeline and of SyncBN.
void TrainStepBuilder::build_stage(TrainStep::Parts& parts) const {
  torch::manual_seed(c_.seed);
  parts.backbone = training_backbone(c_, device_);
  Backbone& backbone = *parts.backbone;
  if (!c_.init_backbone.empty()) {
    // Every rank reads the file, as it opens the data: every stage takes its blocks from it.
    on_every_rank(context_, str_format("reading --init-backbone '{}'", c_.init_backbone),
                  [&] { init_backbone(backbone, c_.init_backbone); });
  }
  PipelinePlan plan =
      plan_pipeline(c_, backbone, comms_.mpi(), context_.rank(), device_, autocast_);
  parts.layout.cut = plan.cut;
  parts.layout.schedule = plan.schedule;
  parts.layout.chunks = plan.chunks;
  parts.predicted_stage_ms = std::move(plan.predicted);
  const PipelineLayout& layout = parts.layout;
  // Grouped casts hand a group's gradients back at once, later than all-reduces that overlap
  // backward want the first of them: only where no other replica sums them.
  backbone.set_grouped_weight_casts(layout.replicas == 1);
  std::unique_ptr<Communicator> pipe;
  if (layout.stages > 1) {
    parts.stage_comm = comms_.create_split(device_, layout.stage, layout.replica);
    pipe = comms_.create_split(device_, layout.replica, layout.stage);
  }
  parts.engine = std::make_unique<PipelineEngine>(layout, backbone, std::move(pipe), device_,
                                                  autocast_, c_.embedding_size);
  parts.engine->place_stage();
  parts.engine->set_phase_timer(&timer_);
  std::vector<torch::Tensor> state;
  for (auto& [name, tensor] : parts.engine->stage_state()) state.push_back(tensor);
  broadcast_tensors(state, stage_comm(parts));
  if (c_.sync_bn) {
    // Its own communicator: fixed shapes, so no per-call agreement; ordered with the classifier's
    // collectives by the stream both use.
    parts.batch_norm_comm = comms_.create_split(device_, layout.stage, layout.replica);
    parts.batch_norm_comm->set_checks(false);
    set_batch_norm_sync(backbone, parts.batch_norm_comm.get());
    parts.engine->keep_parts_in_stream();
  }
  // Dropout differs between ranks, as in any data-parallel run.
  torch::manual_seed(c_.seed + 1000003 * static_cast<uint64_t>(context_.rank() + 1));
}

// The optimizer, the synchroniser that sums gradients among the ranks holding the same stage, and
// DDP's rule for buffers: BN running statistics follow the first replica. SyncBN computes them from
// the global batch, so they already agree and nothing is broadcast.
void TrainStepBuilder::build_gradient_parts(TrainStep::Parts& parts) const {
  const PipelineLayout& layout = parts.layout;
  const std::vector<torch::Tensor> params = parts.engine->stage_parameters();
  parts.optimizer = make_optimizer(c_, params);
  parts.sync = std::make_shared<GradientSynchronizer>(
      params, comms_.create_split(device_, layout.stage, layout.replica), c_.bucket_bytes,
      c_.grad_comm_dtype);
  parts.buffers = std::make_unique<BufferBroadcast>(
      c_.sync_bn ? std::vector<torch::Tensor>() : parts.engine->stage_buffers(), stage_comm(parts));
}

Communicator& TrainStepBuilder::stage_comm(const TrainStep::Parts& parts) const {
  return parts.stage_comm ? *parts.stage_comm : comms_.for_device(device_);
}

void TrainStepBuilder::init_classifier(ShardedMarginSoftmax& classifier) const {
  const std::string& path = c_.init_classifier;
  on_every_rank(context_, str_format("reading --init-classifier '{}'", path), [&] {
    const Hdf5File file(path, Hdf5File::Mode::kRead);
    MYRIAD_CHECK(file.has("weight"), "'{}' has no /weight (myriad-ckpt merge-classifier writes it)",
                 path);
    const std::vector<int64_t> shape = file.shape("weight");
    MYRIAD_CHECK(shape == std::vector<int64_t>({classes_, c_.embedding_size}),
                 "'{}' holds a classifier of {}, this run has {} classes x {}", path,
                 c10::IntArrayRef(shape), classes_, c_.embedding_size);
    const ClassPartition& partition = classifier.partition();
    const torch::Tensor rows = file.read_rows("weight", partition.offset(context_.rank()),
                                              partition.size(context_.rank()));
    torch::NoGradGuard no_grad;
    classifier.weight().copy_(rows);
  });
  log_info("classifier initialised from {}", path);
}

}  // namespace myriad
