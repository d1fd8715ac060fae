#include "myriad/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/data_loader.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/synthetic_dataset.h"
#include "myriad/model/batch_norm.h"
#include "myriad/optim/loss_scaler.h"
#include "myriad/optim/lr_schedule.h"
#include "myriad/optim/multi_tensor_optimizer.h"
#include "myriad/parallel/buffer_broadcast.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/pipeline.h"
#include "myriad/train/async_checkpoint.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/train/graphs_choice.h"
#include "myriad/train/metrics_log.h"
#include "myriad/train/pipeline_plan.h"
#include "myriad/train/progress_report.h"
#include "myriad/train/step_profiler.h"
#include "myriad/train/straggler_report.h"
#include "myriad/train/training_checkpoint.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"
#include "myriad/util/phase_timer.h"
#include "myriad/util/remove_tree.h"
#include "myriad/util/run_lock.h"
#include "myriad/util/stop_signal.h"

namespace myriad {

namespace {

using Clock = std::chrono::steady_clock;

// CTAs per NCCL kernel of the classifier's own communicator with several stages (see the
// constructor): one kept vit_h's first stage as fast under 1F1B as under GPipe; a second gives an
// all-gather across nodes a second channel for one more SM.
constexpr int kPipelineClassifierCtas = 2;

// Opens an HDF5 set on every rank; if any rank cannot (a file missing on one node), all fail.
std::shared_ptr<const ImageSource> open_dataset(const ProcessContext& context,
                                                const std::string& option, const std::string& path,
                                                bool labelled = true) {
  std::shared_ptr<const ImageSource> dataset;
  on_every_rank(context, str_format("opening {} '{}'", option, path),
                [&] { dataset = std::make_shared<Hdf5ImageDataset>(path, labelled); });
  return dataset;
}

void check_shape(const DatasetInfo& info, const InputShape& input, const std::string& what) {
  MYRIAD_CHECK_COLLECTIVE(
      info.channels == input.channels && info.height == input.height && info.width == input.width,
      "{} '{}' holds {}x{}x{} images but --input-shape is {}x{}x{}", what, info.name, info.channels,
      info.height, info.width, input.channels, input.height, input.width);
}

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

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
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

// The pieces of a run, built once.
class Run {
 public:
  // Builds and checks everything, and resumes; writes nothing, so that a run refused at its start
  // leaves no trace.
  Run(ProcessContext& context, const TrainConfig& config, std::string config_ini);
  // The run directory, config.ini, metrics.jsonl and a checked checkpoint directory (collective).
  void open_outputs();
  TrainResult execute();

 private:
  void open_data(int64_t global_batch);
  void build_pipeline();
  void make_loader();
  void log_start(int64_t global_batch) const;
  // The line of a run that stops early, after `steps_done`, and why.
  void log_stop(int64_t steps_done);
  void evaluate(int64_t step, int64_t epoch, TrainResult& result);
  void init_classifier();
  // The state a checkpoint holds, as of now.
  TrainingState training_state();
  void resume();
  void checkpoint(int64_t steps_done, const DataPosition& next);
  // The keys of this replica's samples of `batch` (Activations::keys).
  torch::Tensor sample_keys(const Batch& batch) const;
  // The ranks holding this rank's pipeline stage (all ranks with one stage).
  Communicator& stage_comm() { return stage_comm_ ? *stage_comm_ : comm_; }

  ProcessContext& context_;
  TrainConfig c_;                    // as given, with --precision resolved for the device
  bool precision_was_auto_ = false;  // so the start-up line can say that it was resolved
  torch::Device device_;
  CommFactory comms_;
  Communicator& comm_;
  // Rank 0's, from before the resume reads a checkpoint until everything else is gone.
  std::optional<RunLock> lock_;
  std::shared_ptr<const ImageSource> data_;
  std::shared_ptr<const ImageSource> val_;
  std::vector<std::pair<std::shared_ptr<const ImageSource>, std::vector<bool>>> pairs_;
  int64_t classes_ = 0;
  std::shared_ptr<Backbone> backbone_;
  PipelineLayout layout_;
  std::unique_ptr<Communicator> stage_comm_;       // with several stages
  std::unique_ptr<Communicator> classifier_comm_;  // with several stages; else comm_ serves
  // Before the engine: its CUDA graphs hold the all-reduces they recorded on the synchroniser's
  // communicator, which NCCL does not let go of while they exist.
  std::unique_ptr<GradientSynchronizer> sync_;
  std::unique_ptr<PipelineEngine> engine_;
  // The balancer's forward + backward ms per micro-batch of each stage (when it profiled), which
  // the progress report sets beside the measured ones.
  StagePrediction predicted_stage_ms_;
  std::vector<torch::Tensor> params_;  // this stage's trainable parameters
  std::unique_ptr<ShardedMarginSoftmax> classifier_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  SkippableStep* backbone_step_ = nullptr;  // optimizer_'s step
  std::unique_ptr<Communicator> batch_norm_comm_;
  std::optional<BufferBroadcast> buffers_;  // without SyncBN
  std::shared_ptr<DistributedSampler> sampler_;
  std::unique_ptr<BatchSource> loader_;
  std::optional<torch::ScalarType> autocast_;
  DynamicLossScaler scaler_;
  LrSchedule schedule_;
  std::optional<MetricsLog> metrics_;  // once open_outputs() has run
  std::string config_ini_;
  PhaseTimer timer_;
  StragglerReport stragglers_;
  int64_t total_steps_ = 0;
  std::optional<GraphsChoice> graphs_;
  CheckpointStore store_;
  std::optional<AsyncCheckpointer> checkpointer_;
  StopFile stop_file_;
  int64_t start_step_ = 0;
  DataPosition start_position_;
  std::optional<ProgressReport> progress_;  // once the parts it reads exist
  std::optional<StepProfiler> profiler_;
};

Run::Run(ProcessContext& context, const TrainConfig& config, std::string config_ini)
    : context_(context),
      c_(config),
      device_(context.select_device(config.device)),
      comms_(context),
      comm_(comms_.for_device(device_)),
      scaler_(device_),
      config_ini_(std::move(config_ini)),
      timer_(device_, true),
      stragglers_(context),
      store_(config.checkpoint_dir),
      stop_file_(default_stop_file(config.run_dir)) {
  precision_was_auto_ = c_.precision == Precision::kAuto;
  c_.precision = resolve_precision(c_.precision, device_);
  MYRIAD_CHECK_COLLECTIVE(
      c_.profile_first == 0 || device_.is_cuda() || !c_.timeline.empty(),
      "--profile-steps needs GPUs (it drives the CUDA profiler), or --timeline");
  MYRIAD_CHECK_COLLECTIVE(c_.cuda_graphs != Toggle::kOn || device_.is_cuda(),
                          "--cuda-graphs on needs GPUs");
  if (c_.deterministic) use_deterministic_algorithms();
  autocast_ = autocast_dtype(c_.precision);
  layout_ = pipeline_layout(context.size(), context.rank(), c_.pipeline_stages, c_.micro_batches);
  // --batch-size is per replica: a pipeline's stages share their replica's batch.
  const int64_t global_batch = c_.batch_size * layout_.replicas;

  open_data(global_batch);

  // The classifier first: a pipeline's cut must fit beside it in each GPU's memory.
  // With stages, a stage's collectives for a classifier part wait on the GPU for the last stage
  // beside the stage's own passes (1F1B), and NCCL's default CTAs per kernel then hold SMs that
  // those passes lose (docs/pipeline.md): a few CTAs move the part's small tensors as fast.
  if (layout_.stages > 1)
    classifier_comm_ = comms_.create(device_, CommOptions{kPipelineClassifierCtas});
  classifier_ = std::make_unique<ShardedMarginSoftmax>(classifier_comm_ ? *classifier_comm_ : comm_,
                                                       classifier_options(c_, classes_), device_);
  if (!c_.init_classifier.empty()) init_classifier();
  if (c_.precision == Precision::kFp16)
    classifier_->set_inverse_loss_scale(scaler_.inverse_scale());
  build_pipeline();
  optimizer_ = make_optimizer(c_, params_);
  backbone_step_ = dynamic_cast<SkippableStep*>(optimizer_.get());
  // Gradients are summed among the ranks that hold the same stage.
  sync_ = std::make_unique<GradientSynchronizer>(
      params_, comms_.create_split(device_, layout_.stage, layout_.replica), c_.bucket_bytes,
      c_.grad_comm_dtype);

  sampler_ = std::make_shared<DistributedSampler>(data_->info().size, global_batch,
                                                  layout_.replicas, c_.seed);
  total_steps_ = c_.max_steps > 0 ? c_.max_steps : c_.epochs * sampler_->steps_per_epoch();
  schedule_.kind = c_.lr_schedule;
  schedule_.warmup_steps =
      c_.warmup_epochs > 0
          ? static_cast<int64_t>(std::llround(c_.warmup_epochs * sampler_->steps_per_epoch()))
          : c_.warmup_steps;
  schedule_.total_steps = total_steps_;
  schedule_.power = c_.poly_power;
  schedule_.milestones = c_.lr_steps;
  schedule_.gamma = c_.lr_gamma;
  // One job per run directory: a second one is refused here, before it reads or writes there.
  on_every_rank(context, "locking the run directory", [&] {
    if (context.rank() == 0) lock_.emplace(c_.run_dir, c_.checkpoint_dir);
  });
  resume();
  // DDP's rule: BN running statistics follow the first replica. SyncBN computes them from the
  // global batch, so they already agree.
  if (!c_.sync_bn) buffers_.emplace(engine_->stage_buffers(), stage_comm());
  if (c_.profile_first > 0 && (c_.profile_last <= start_step_ || c_.profile_first > total_steps_))
    log_warn(
        "--profile-steps {}:{} lies outside the steps this run takes ({} to {}): nothing is "
        "profiled",
        c_.profile_first, c_.profile_last, start_step_ + 1, total_steps_);
  CheckpointOptions checkpoints;
  checkpoints.keep = c_.checkpoint_keep;
  checkpoints.sync = c_.checkpoint_sync;
  checkpoints.host_memory = c_.checkpoint_host_memory;
  checkpointer_.emplace(context_, store_, training_state(), checkpoints,
                        [this](const nlohmann::json& record) { metrics_->write(record); });
  if (context.rank() == 0 && stop_file_.clear_if_stale())
    log_warn("removed the stop request '{}': it is from before this run", stop_file_.path());
  make_loader();
  progress_.emplace(ProgressReport::Sources{
      c_, device_, context.size(), layout_.replicas, comm_, comms_.mpi(), timer_, *sync_, *engine_,
      scaler_, stragglers_, static_cast<double>(backbone_->multiply_adds()),
      std::move(predicted_stage_ms_)});
  profiler_.emplace(context, c_, device_, *engine_);
  log_start(global_batch);
}

// The training data (or the synthetic set) and C, the validation set and the verification pairs:
// opened on every rank, their shapes checked against --input-shape.
void Run::open_data(int64_t global_batch) {
  if (uses_synthetic_data(c_)) {
    classes_ = synthetic_classes(c_);
    const int64_t size =
        c_.synthetic_size > 0
            ? c_.synthetic_size
            : std::max(100 * global_batch, std::min<int64_t>(64 * classes_, int64_t{1} << 22));
    data_ = std::make_shared<SyntheticDataset>(size, classes_, static_cast<int>(c_.input.channels),
                                               static_cast<int>(c_.input.height),
                                               static_cast<int>(c_.input.width), c_.seed);
  } else {
    data_ = open_dataset(context_, "--data", c_.data);
    check_shape(data_->info(), c_.input, "--data");
    classes_ = c_.num_classes > 0 ? c_.num_classes : data_->info().num_classes;
    MYRIAD_CHECK_COLLECTIVE(classes_ >= data_->info().num_classes,
                            "--num-classes {} is smaller than the {} classes of '{}'", classes_,
                            data_->info().num_classes, c_.data);
  }
  if (!c_.val_data.empty()) {
    val_ = open_dataset(context_, "--val-data", c_.val_data);
    check_shape(val_->info(), c_.input, "--val-data");
    MYRIAD_CHECK_COLLECTIVE(val_->info().num_classes <= classes_,
                            "'{}' has {} classes, the classifier {}", c_.val_data,
                            val_->info().num_classes, classes_);
  }
  for (const std::string& path : c_.eval_pairs) {
    auto images = open_dataset(context_, "--eval-pairs", path, false);
    check_shape(images->info(), c_.input, "--eval-pairs");
    std::vector<bool> issame;
    on_every_rank(context_, str_format("reading the pairs of '{}'", path),
                  [&] { issame = read_pair_labels(path, images->info().size); });
    pairs_.emplace_back(std::move(images), std::move(issame));
  }
}

// The first stage's loader from the resumed position; the other stages follow its positions.
void Run::make_loader() {
  if (layout_.first()) {
    LoaderOptions lo;
    lo.start = start_position_;
    lo.workers = c_.workers;
    lo.prefetch = c_.prefetch;
    lo.random_flip = c_.random_flip;
    lo.seed = c_.seed;
    lo.rank = layout_.replica;
    lo.pin_memory = device_.is_cuda();
    loader_ = std::make_unique<DataLoader>(data_, sampler_, lo);
    if (c_.data == "synthetic-resident")
      loader_ = std::make_unique<ResidentBatch>(loader_->next(), sampler_, device_);
  } else {
    // Only the first stage reads data; the others follow its positions.
    Batch positions;
    positions.position = start_position_;
    positions.next = sampler_->advance(start_position_, 1);
    loader_ = std::make_unique<ResidentBatch>(positions, sampler_, device_);
  }
}

// The start-up lines: placement, precision, backbone, graphs, buckets, classes, data and steps.
void Run::log_start(int64_t global_batch) const {
  int64_t backbone_params = 0;
  for (const torch::Tensor& p : backbone_->parameters()) backbone_params += p.numel();
  const std::string placement = context_.placement(device_);
  log_info(
      "myriad-train: {}; {}{} (backbone {}, {:.1f}M parameters, {:.2f}G multiply-adds per image, "
      "{}, batch norm in {}{}, {} gradient buckets{}), {} classes ({} per rank, {}), {}",
      placement, to_string(c_.precision), precision_was_auto_ ? " (--precision auto)" : "",
      c_.backbone, backbone_params / 1e6, backbone_->multiply_adds() / 1e9,
      backbone_->channels_last() ? "channels-last" : "NCHW",
      batch_norm_kernels(device_, c_.sync_bn, backbone_->channels_last()),
      graphs_->describe().empty() ? "" : ", " + graphs_->describe(), sync_->bucket_count(),
      c_.grad_comm_dtype == torch::kFloat32
          ? ""
          : std::string(", all-reduced in ") + float_dtype_name(c_.grad_comm_dtype),
      classes_, classifier_->partition().size(context_.rank()), classifier_->kernels(),
      c_.margin.describe());
  log_info(
      "data {} ({} images {}x{}x{}), global batch {} ({} per {}), {} steps per epoch, {} steps",
      data_->info().name, data_->info().size, data_->info().channels, data_->info().height,
      data_->info().width, global_batch, c_.batch_size, layout_.stages > 1 ? "replica" : "rank",
      sampler_->steps_per_epoch(), total_steps_);
}

void Run::log_stop(int64_t steps_done) {
  const std::string why = stop_requested()         ? stop_signal_name()
                          : stop_file_.requested() ? "the stop request " + stop_file_.path()
                          : steps_done == c_.stop_at_step
                              ? std::string("--stop-at-step")
                              : std::string("a request another rank received");
  log_info("stopping after step {} ({}); resume with --resume auto", steps_done, why);
}

// The backbone, whole on every rank, and this rank's stage of it on the device (all of it with
// one stage), its optimizer's parameters and its communicators.
void Run::build_pipeline() {
  torch::manual_seed(c_.seed);
  backbone_ = training_backbone(c_, device_);
  if (!c_.init_backbone.empty()) {
    // Every rank reads the file, as it opens the data: every stage takes its blocks from it.
    on_every_rank(context_, str_format("reading --init-backbone '{}'", c_.init_backbone),
                  [&] { init_backbone(*backbone_, c_.init_backbone); });
  }
  PipelinePlan plan =
      plan_pipeline(c_, *backbone_, comms_.mpi(), context_.rank(), device_, autocast_);
  layout_.cut = plan.cut;
  layout_.schedule = plan.schedule;
  predicted_stage_ms_ = std::move(plan.predicted);
  if (layout_.stages > 1) {
    stage_comm_ = comms_.create_split(device_, layout_.stage, layout_.replica);
    engine_ = std::make_unique<PipelineEngine>(
        layout_, *backbone_, comms_.create_split(device_, layout_.replica, layout_.stage), device_,
        autocast_, c_.embedding_size);
  } else {
    engine_ = std::make_unique<PipelineEngine>(layout_, *backbone_, nullptr, device_, autocast_,
                                               c_.embedding_size);
  }
  engine_->place_stage();
  engine_->set_phase_timer(&timer_);
  graphs_.emplace(c_.cuda_graphs, cuda_graphs_possible(c_, device_), *engine_, comms_.mpi(),
                  device_);
  std::vector<torch::Tensor> state;
  for (auto& [name, tensor] : engine_->stage_state()) state.push_back(tensor);
  broadcast_tensors(state, stage_comm());
  if (c_.sync_bn) {
    // Its own communicator: fixed shapes, so no per-call agreement; ordered with the classifier's
    // collectives by the stream both use.
    batch_norm_comm_ = comms_.create_split(device_, layout_.stage, layout_.replica);
    batch_norm_comm_->set_checks(false);
    set_batch_norm_sync(*backbone_, batch_norm_comm_.get());
    engine_->keep_parts_in_stream();
  }
  // Dropout differs between ranks, as in any data-parallel run.
  torch::manual_seed(c_.seed + 1000003 * static_cast<uint64_t>(context_.rank() + 1));
  params_ = engine_->stage_parameters();
}

void Run::open_outputs() {
  namespace fs = std::filesystem;
  // What this start creates is removed again if the start fails: a refused run leaves nothing.
  const bool new_run_dir = lock_ && lock_->created_run_dir();
  const bool new_checkpoint_dir =
      !fs::exists(store_.root()) || (lock_ && lock_->created_checkpoint_dir());
  try {
    on_every_rank(context_, "opening the run's outputs", [&] {
      if (context_.rank() == 0) {
        std::error_code error;
        fs::create_directories(c_.run_dir, error);
        MYRIAD_CHECK(!error, "cannot create the run directory '{}': {}", c_.run_dir,
                     error.message());
        store_.check_writable();
        const std::string path = (fs::path(c_.run_dir) / "config.ini").string();
        write_file_atomically(path, config_ini_);
        log_info("effective configuration (saved to {}):\n{}", path, config_ini_);
      }
      metrics_.emplace((fs::path(c_.run_dir) / "metrics.jsonl").string(), context_.rank() == 0,
                       c_.tensorboard_dir);
    });
  } catch (const Error&) {
    metrics_.reset();
    if (context_.rank() == 0) {
      if (new_checkpoint_dir) remove_tree(store_.root());
      if (new_run_dir) remove_tree(c_.run_dir);
    }
    throw;
  }
}

// Each rank takes its rows of the --init-classifier file.
void Run::init_classifier() {
  const std::string& path = c_.init_classifier;
  on_every_rank(context_, str_format("reading --init-classifier '{}'", path), [&] {
    const Hdf5File file(path, Hdf5File::Mode::kRead);
    MYRIAD_CHECK(file.has("weight"), "'{}' has no /weight (myriad-ckpt merge-classifier writes it)",
                 path);
    const std::vector<int64_t> shape = file.shape("weight");
    MYRIAD_CHECK(shape == std::vector<int64_t>({classes_, c_.embedding_size}),
                 "'{}' holds a classifier of {}, this run has {} classes x {}", path,
                 c10::IntArrayRef(shape), classes_, c_.embedding_size);
    const ClassPartition& partition = classifier_->partition();
    const torch::Tensor rows = file.read_rows("weight", partition.offset(context_.rank()),
                                              partition.size(context_.rank()));
    torch::NoGradGuard no_grad;
    classifier_->weight().copy_(rows);
  });
  log_info("classifier initialised from {}", path);
}

TrainingState Run::training_state() {
  TrainingState state;
  state.backbone = backbone_.get();
  state.optimizer = optimizer_.get();
  state.classifier = classifier_.get();
  state.scaler = &scaler_;
  state.config = config_ini_;
  return state;
}

void Run::resume() {
  TrainingState state = training_state();
  resume_training(context_, c_.resume, store_, state);
  start_step_ = state.step;
  start_position_ = state.position;
}

void Run::checkpoint(int64_t steps_done, const DataPosition& next) {
  const LocalWork work("a checkpoint");
  TrainingState state = training_state();
  state.step = steps_done;
  state.position = next;
  // The backbone is saved whole: rank 0 takes the other stages' parts first.
  state.other_stage_states = engine_->gather_for_save(*optimizer_);
  checkpointer_->save(state);
}

torch::Tensor Run::sample_keys(const Batch& batch) const {
  const int64_t first = sampler_->first_key(batch.position, layout_.replica);
  return torch::arange(first, first + batch.labels.size(0),
                       torch::dtype(torch::kInt64).device(device_));
}

void Run::evaluate(int64_t step, int64_t epoch, TrainResult& result) {
  if (!val_ && pairs_.empty()) return;
  const LocalWork work("an evaluation");
  backbone_->eval();
  EvalSetup setup;
  setup.comm = &comm_;
  setup.device = device_;
  setup.batch_size = c_.eval_batch_size;
  setup.autocast = autocast_;
  // Through this rank's stage (the whole backbone with one stage); every replica a slice.
  setup.replicas = layout_.replicas;
  setup.replica = layout_.replica;
  setup.reads_images = layout_.first();
  setup.forward = [this](const torch::Tensor& images) { return engine_->infer(images); };
  nlohmann::json record = {{"kind", "eval"}, {"step", step}, {"epoch", epoch}};
  if (val_) {
    const ClassificationEval e = evaluate_classification(*backbone_, *classifier_, *val_, setup);
    const std::string knn =
        e.knn_queries > 0
            ? str_format("kNN top-1 {:.2f}% ({} queries)", 100.0 * e.knn_top1, e.knn_queries)
            : std::string("no kNN (no class has two of the set's first samples)");
    log_info("eval at step {}: top-1 {:.2f}% ({} samples), {}", step, 100.0 * e.top1, e.samples,
             knn);
    record["top1"] = e.top1;
    if (e.knn_queries > 0) {
      record["knn_top1"] = e.knn_top1;
      record["knn_queries"] = e.knn_queries;
    }
    record["samples"] = e.samples;
    result.eval = e;
  }
  for (const auto& [images, issame] : pairs_) {
    const VerificationEval v = evaluate_verification(*backbone_, *images, issame, setup);
    const std::string name = std::filesystem::path(images->info().name).stem().string();
    log_info("eval at step {}: {} verification accuracy {:.2f}% +- {:.2f}% ({} pairs)", step, name,
             100.0 * v.accuracy, 100.0 * v.std, v.pairs);
    record["verification"][name] = {
        {"accuracy", v.accuracy}, {"std", v.std}, {"threshold", v.threshold}};
  }
  metrics_->write(record);
  backbone_->train();
}

TrainResult Run::execute() {
  TrainResult result;
  const bool fp16 = c_.precision == Precision::kFp16;
  backbone_->train();
  progress_->start(total_steps_);
  for (int64_t step = start_step_; step < total_steps_; ++step) {
    HangWatchdog::instance().step_started(step);
    graphs_->before_step();
    profiler_->before_step(step);
    // A checkpoint's copy of the backbone is done before this step changes it.
    checkpointer_->order_before_step();
    const auto wait_start = Clock::now();
    Batch batch = loader_->next();
    progress_->add_data_wait(seconds_since(wait_start));
    const double factor = schedule_.factor(step);
    set_learning_rate(*optimizer_, c_.lr * factor);
    classifier_->optimizer().set_lr(c_.classifier_lr * factor);

    stragglers_.step_started();
    fault_slow_step(context_.rank());
    timer_.mark("forward");
    // The first stage loaded the replica's batch; the classifier needs its labels on the last.
    const torch::Tensor labels = engine_->route_labels(
        layout_.first() ? batch.labels.to(device_, /*non_blocking=*/true) : torch::Tensor());
    if (buffers_) buffers_->broadcast();
    // The classifier on embeddings from the last stages (none from the others): the loss, and by
    // its backward their gradient.
    const auto classify = [&](const torch::Tensor& embeddings, const torch::Tensor& part_labels) {
      timer_.mark("forward");
      const torch::Tensor part_loss = classifier_->forward(embeddings, part_labels);
      timer_.mark("backward");
      // The classifier updates its rows: not before a checkpoint has copied them.
      checkpointer_->order_before_backward();
      (fp16 ? part_loss * scaler_.scale() : part_loss).backward();
      return part_loss;
    };
    // The backbone, micro-batch by micro-batch through this rank's stage, on the pipeline's
    // schedule around the classifier: GPipe runs it once on the replica's batch, which also
    // updates its rows; 1F1B once per micro-batch, and its rows are updated once all have passed.
    // The backbone's gradients are summed over the micro-batches and, in the last backward pass,
    // over the replicas.
    const bool classifier_in_parts = layout_.schedule == PipelineSchedule::k1F1B;
    if (classifier_in_parts) classifier_->begin_parts(labels, engine_->part_rows(labels));
    const torch::Tensor loss = engine_->train_step(
        layout_.first() ? batch.images.to(device_, /*non_blocking=*/true) : torch::Tensor(),
        layout_.first() ? sample_keys(batch) : torch::Tensor(), labels, classify, *sync_);
    if (classifier_in_parts) classifier_->finish_parts();
    timer_.mark("communication");
    sync_->finish();
    timer_.mark("optimizer");
    // fp16: gradients unscaled, and a flag on the device that cancels the step on every rank if
    // any of them is not finite.
    const torch::Tensor overflow =
        fp16 ? scaler_.unscale(sync_->buffers(), comm_) : torch::Tensor();
    if (c_.grad_clip > 0) engine_->clip_gradient_norm(sync_->buffers(), c_.grad_clip);
    backbone_step_->step_unless(overflow);
    sync_->clear_gradients();
    timer_.stop();
    stragglers_.step_finished();
    if (fp16) scaler_.update(overflow);
    graphs_->after_step();
    profiler_->after_step(step, total_steps_);
    progress_->step_done();

    if ((step + 1) % c_.log_every == 0 || step + 1 == total_steps_)
      progress_->write(*metrics_, step, batch.position.epoch, loss, c_.lr * factor);
    if (c_.eval_every > 0 && (step + 1) % c_.eval_every == 0 && step + 1 < total_steps_) {
      evaluate(step + 1, batch.position.epoch, result);
    }
    result.steps = step + 1;
    // Every rank agrees at the same step boundary, whichever got the signal or saw the stop file
    // first.
    const bool stop = !context_.all_true(!stop_requested() && !stop_file_.requested() &&
                                         step + 1 != c_.stop_at_step);
    if (stop && context_.rank() == 0) stop_file_.clear();
    // A checkpoint written in the background is published once every rank's files are durable.
    checkpointer_->poll();
    const bool periodic = c_.checkpoint_every > 0 &&
                          ((step + 1) % c_.checkpoint_every == 0 || step + 1 == total_steps_);
    if (stop || periodic) checkpoint(step + 1, batch.next);
    if (stop || step + 1 == total_steps_) {
      // Exit 75, or the end, only with the last checkpoint durable.
      const LocalWork work("a checkpoint");
      checkpointer_->complete();
    }
    if (stop && step + 1 < total_steps_) {
      log_stop(step + 1);
      result.stopped = true;
      return result;
    }
  }
  evaluate(total_steps_, total_steps_ / sampler_->steps_per_epoch(), result);
  progress_->log_done();
  return result;
}

}  // namespace

TrainResult train(ProcessContext& context, const TrainConfig& config,
                  const std::string& config_ini) {
  set_torch_threads(config.threads, context.local_size());
  install_stop_handlers();
  // From here on a rank that waits on dead peers ends the job, whatever it is doing.
  const WatchdogSession watchdog(config.hang_timeout);
  Run run(context, config, config_ini);
  run.open_outputs();
  // Libraries started by the run (CUDA, NCCL, the MPI transports) may install handlers of their
  // own; a stop signal must still reach the training loop.
  for (const std::string& signal : install_stop_handlers())
    log_warn("a library replaced the {} handler during start-up; restored", signal);
  return run.execute();
}

}  // namespace myriad
