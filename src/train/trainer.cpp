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
#include "myriad/optim/lr_schedule.h"
#include "myriad/train/async_checkpoint.h"
#include "myriad/train/conv_statistics_check.h"
#include "myriad/train/graphs_choice.h"
#include "myriad/train/metrics_log.h"
#include "myriad/train/progress_report.h"
#include "myriad/train/run_evaluation.h"
#include "myriad/train/step_profiler.h"
#include "myriad/train/straggler_report.h"
#include "myriad/train/train_step.h"
#include "myriad/train/training_checkpoint.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/autocast.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/log.h"
#include "myriad/util/phase_timer.h"
#include "myriad/util/remove_tree.h"
#include "myriad/util/run_lock.h"
#include "myriad/util/stop_signal.h"

namespace myriad {

namespace {

using Clock = std::chrono::steady_clock;

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

// `config` with --precision resolved for `device`, checked against it (collective).
TrainConfig resolved_config(const TrainConfig& config, const torch::Device& device) {
  TrainConfig c = config;
  c.precision = resolve_precision(c.precision, device);
  MYRIAD_CHECK_COLLECTIVE(
      c.profile_first == 0 || device.is_cuda() || !c.timeline.empty(),
      "--profile-steps needs GPUs (it drives the CUDA profiler), or --timeline");
  MYRIAD_CHECK_COLLECTIVE(c.cuda_graphs != Toggle::kOn || device.is_cuda(),
                          "--cuda-graphs on needs GPUs");
  return c;
}

// This rank's place among the pipeline's stages and replicas, before the cut.
PipelineLayout rank_layout(const ProcessContext& context, const TrainConfig& c) {
  return pipeline_layout(context.size(), context.rank(), c.pipeline_stages, c.micro_batches);
}

// The training data (or the synthetic set) and C.
struct TrainingData {
  std::shared_ptr<const ImageSource> images;
  int64_t classes = 0;
};

// Opened on every rank, its shape checked against --input-shape. A synthetic set's size by default
// gives about 100 global batches, or 64 samples a class.
TrainingData open_training_data(const ProcessContext& context, const TrainConfig& c,
                                int64_t global_batch) {
  TrainingData data;
  if (uses_synthetic_data(c)) {
    data.classes = synthetic_classes(c);
    const int64_t size =
        c.synthetic_size > 0
            ? c.synthetic_size
            : std::max(100 * global_batch, std::min<int64_t>(64 * data.classes, int64_t{1} << 22));
    data.images = std::make_shared<SyntheticDataset>(
        size, data.classes, static_cast<int>(c.input.channels), static_cast<int>(c.input.height),
        static_cast<int>(c.input.width), c.seed);
    return data;
  }
  data.images = open_dataset(context, "--data", c.data);
  check_shape(data.images->info(), c.input, "--data");
  data.classes = c.num_classes > 0 ? c.num_classes : data.images->info().num_classes;
  MYRIAD_CHECK_COLLECTIVE(data.classes >= data.images->info().num_classes,
                          "--num-classes {} is smaller than the {} classes of '{}'", data.classes,
                          data.images->info().num_classes, c.data);
  return data;
}

// The validation set and the verification pairs, opened on every rank and checked.
EvalSets open_eval_sets(const ProcessContext& context, const TrainConfig& c, int64_t classes) {
  EvalSets sets;
  if (!c.val_data.empty()) {
    sets.val = open_dataset(context, "--val-data", c.val_data);
    check_shape(sets.val->info(), c.input, "--val-data");
    MYRIAD_CHECK_COLLECTIVE(sets.val->info().num_classes <= classes,
                            "'{}' has {} classes, the classifier {}", c.val_data,
                            sets.val->info().num_classes, classes);
  }
  for (const std::string& path : c.eval_pairs) {
    auto images = open_dataset(context, "--eval-pairs", path, false);
    check_shape(images->info(), c.input, "--eval-pairs");
    std::vector<bool> issame;
    on_every_rank(context, str_format("reading the pairs of '{}'", path),
                  [&] { issame = read_pair_labels(path, images->info().size); });
    sets.pairs.emplace_back(std::move(images), std::move(issame));
  }
  return sets;
}

LrSchedule lr_schedule(const TrainConfig& c, int64_t steps_per_epoch, int64_t total_steps) {
  LrSchedule schedule;
  schedule.kind = c.lr_schedule;
  schedule.warmup_steps =
      c.warmup_epochs > 0 ? static_cast<int64_t>(std::llround(c.warmup_epochs * steps_per_epoch))
                          : c.warmup_steps;
  schedule.total_steps = total_steps;
  schedule.power = c.poly_power;
  schedule.milestones = c.lr_steps;
  schedule.gamma = c.lr_gamma;
  return schedule;
}

// Where a resumed run starts: the steps done and the position of the next batch.
struct StartPoint {
  int64_t step = 0;
  DataPosition position;
};

// The pieces of a run, each built from the ones before it; together they run the steps.
class Run {
 public:
  // Builds and checks everything and resumes; only then opens the run's outputs (the run
  // directory, config.ini, metrics.jsonl and a checked checkpoint directory), so that a run refused
  // at its start leaves no trace. Collective. `extra` observe the steps after the run's own.
  Run(ProcessContext& context, const TrainConfig& config, std::string config_ini,
      const std::vector<StepObserver*>& extra);
  TrainResult execute();

 private:
  std::unique_ptr<RunLock> lock_run_directory();
  StartPoint resume();
  std::unique_ptr<BatchSource> make_loader() const;
  CheckpointOptions checkpoint_options() const;
  MetricsLog open_outputs();
  ProgressReport::Sources progress_sources();
  EvalSetup eval_setup();
  void log_start();
  // The line of a run that stops early, after `steps_done`, and why.
  void log_stop(int64_t steps_done);
  // The state a checkpoint holds, as of now.
  TrainingState training_state();
  void checkpoint(int64_t steps_done, const DataPosition& next);
  // The keys of this replica's samples of `batch` (Activations::keys).
  torch::Tensor sample_keys(const Batch& batch) const;

  ProcessContext& context_;
  torch::Device device_;
  TrainConfig c_;             // as given, with --precision resolved for the device
  bool precision_was_auto_;   // so the start-up line can say that it was resolved
  const char* conv_engines_;  // how cuDNN picks each convolution's engine (use_convolution_engines)
  bool conv_statistics_;      // batch norms take statistics from convolutions (--conv-statistics)
  std::string config_ini_;
  CommFactory comms_;
  Communicator& comm_;
  int64_t global_batch_;  // --batch-size is per replica: a pipeline's stages share their batch
  TrainingData data_;
  EvalSets eval_sets_;
  PhaseTimer timer_;
  TrainStep step_;
  std::shared_ptr<DistributedSampler> sampler_;
  int64_t total_steps_;
  LrSchedule schedule_;
  CheckpointStore store_;
  // Rank 0's (none elsewhere): from before the resume reads a checkpoint until the run ends.
  std::unique_ptr<RunLock> lock_;
  StartPoint start_;
  std::unique_ptr<BatchSource> loader_;
  StopFile stop_file_;
  StragglerReport stragglers_;
  GraphsChoice graphs_;
  ConvStatisticsCheck conv_statistics_check_;
  StepProfiler profiler_;
  AsyncCheckpointer checkpointer_;
  MetricsLog metrics_;
  ProgressReport progress_;
  RunEvaluation evaluation_;
  StepObservers observers_;
};

Run::Run(ProcessContext& context, const TrainConfig& config, std::string config_ini,
         const std::vector<StepObserver*>& extra)
    : context_(context),
      device_(context.select_device(config.device)),
      c_(resolved_config(config, device_)),
      precision_was_auto_(config.precision == Precision::kAuto),
      conv_engines_(use_convolution_engines(
          convolution_engines(c_.deterministic, c_.cudnn_benchmark, device_), device_)),
      conv_statistics_(use_convolution_statistics(
          convolution_statistics(conv_statistics_request(c_, device_), device_))),
      config_ini_(std::move(config_ini)),
      comms_(context),
      comm_(comms_.for_device(device_)),
      global_batch_(c_.batch_size * rank_layout(context, c_).replicas),
      data_(open_training_data(context, c_, global_batch_)),
      eval_sets_(open_eval_sets(context, c_, data_.classes)),
      timer_(device_, true),
      step_(TrainStepBuilder(context, c_, device_, comms_, rank_layout(context, c_), data_.classes,
                             timer_)
                .build()),
      sampler_(std::make_shared<DistributedSampler>(data_.images->info().size, global_batch_,
                                                    step_.layout().replicas, c_.seed)),
      total_steps_(c_.max_steps > 0 ? c_.max_steps : c_.epochs * sampler_->steps_per_epoch()),
      schedule_(lr_schedule(c_, sampler_->steps_per_epoch(), total_steps_)),
      store_(c_.checkpoint_dir),
      lock_(lock_run_directory()),
      start_(resume()),
      loader_(make_loader()),
      stop_file_(default_stop_file(c_.run_dir)),
      stragglers_(context),
      graphs_(c_.cuda_graphs, cuda_graphs_possible(c_, device_), step_.engine(), comms_.mpi(),
              device_),
      conv_statistics_check_(context, c_.conv_statistics, conv_statistics_, c_.backbone),
      profiler_(context, c_, device_, step_.engine()),
      checkpointer_(context, store_, training_state(), checkpoint_options(),
                    [this](const nlohmann::json& record) { metrics_.write(record); }),
      metrics_(open_outputs()),
      progress_(progress_sources()),
      evaluation_(eval_sets_, c_.eval_every, step_.backbone(), step_.classifier(), eval_setup(),
                  metrics_),
      // In the order of their collectives on every rank; the checkpoint's poll comes last.
      observers_{&stragglers_, &graphs_,     &conv_statistics_check_, &profiler_,
                 &progress_,   &evaluation_, &checkpointer_} {
  for (StepObserver* observer : extra) observers_.add(*observer);
  if (c_.profile_first > 0 && (c_.profile_last <= start_.step || c_.profile_first > total_steps_))
    log_warn(
        "--profile-steps {}:{} lies outside the steps this run takes ({} to {}): nothing is "
        "profiled",
        c_.profile_first, c_.profile_last, start_.step + 1, total_steps_);
  if (context.rank() == 0 && stop_file_.clear_if_stale())
    log_warn("removed the stop request '{}': it is from before this run", stop_file_.path());
  log_start();
}

// One job per run directory: a second one is refused here, before it reads or writes there.
std::unique_ptr<RunLock> Run::lock_run_directory() {
  std::unique_ptr<RunLock> lock;
  on_every_rank(context_, "locking the run directory", [&] {
    if (context_.rank() == 0) lock = std::make_unique<RunLock>(c_.run_dir, c_.checkpoint_dir);
  });
  return lock;
}

StartPoint Run::resume() {
  TrainingState state = training_state();
  resume_training(context_, c_.resume, store_, state);
  return {state.step, state.position};
}

// The first stage's loader from the resumed position; the other stages follow its positions.
std::unique_ptr<BatchSource> Run::make_loader() const {
  const PipelineLayout& layout = step_.layout();
  if (!layout.first()) {
    Batch positions;
    positions.position = start_.position;
    positions.next = sampler_->advance(start_.position, 1);
    return std::make_unique<ResidentBatch>(positions, sampler_, device_);
  }
  LoaderOptions lo;
  lo.start = start_.position;
  lo.workers = c_.workers;
  lo.prefetch = c_.prefetch;
  lo.random_flip = c_.random_flip;
  lo.seed = c_.seed;
  lo.rank = layout.replica;
  lo.pin_memory = device_.is_cuda();
  auto loader = std::make_unique<DataLoader>(data_.images, sampler_, lo);
  if (c_.data != "synthetic-resident") return loader;
  return std::make_unique<ResidentBatch>(loader->next(), sampler_, device_);
}

CheckpointOptions Run::checkpoint_options() const {
  CheckpointOptions options;
  options.keep = c_.checkpoint_keep;
  options.sync = c_.checkpoint_sync;
  options.host_memory = c_.checkpoint_host_memory;
  return options;
}

// What this start creates is removed again if the opening fails: a refused run leaves nothing.
MetricsLog Run::open_outputs() {
  namespace fs = std::filesystem;
  const bool new_run_dir = lock_ && lock_->created_run_dir();
  const bool new_checkpoint_dir =
      !fs::exists(store_.root()) || (lock_ && lock_->created_checkpoint_dir());
  std::unique_ptr<MetricsLog> metrics;
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
      metrics = std::make_unique<MetricsLog>((fs::path(c_.run_dir) / "metrics.jsonl").string(),
                                             context_.rank() == 0, c_.tensorboard_dir);
    });
  } catch (const Error&) {
    metrics.reset();
    if (context_.rank() == 0) {
      if (new_checkpoint_dir) remove_tree(store_.root());
      if (new_run_dir) remove_tree(c_.run_dir);
    }
    throw;
  }
  return std::move(*metrics);
}

ProgressReport::Sources Run::progress_sources() {
  return ProgressReport::Sources{c_,
                                 device_,
                                 context_.size(),
                                 step_.layout().replicas,
                                 comm_,
                                 comms_.mpi(),
                                 timer_,
                                 step_.sync(),
                                 step_.engine(),
                                 step_.scaler(),
                                 stragglers_,
                                 metrics_,
                                 static_cast<double>(step_.backbone().multiply_adds()),
                                 step_.predicted_stage_ms()};
}

// Through this rank's stage (the whole backbone with one stage); every replica a slice.
EvalSetup Run::eval_setup() {
  EvalSetup setup;
  setup.comm = &comm_;
  setup.device = device_;
  setup.batch_size = c_.eval_batch_size;
  setup.autocast = autocast_dtype(c_.precision);
  setup.replicas = step_.layout().replicas;
  setup.replica = step_.layout().replica;
  setup.reads_images = step_.layout().first();
  PipelineEngine& engine = step_.engine();
  setup.forward = [&engine](const torch::Tensor& images) { return engine.infer(images); };
  return setup;
}

// The start-up lines: placement, precision, backbone, graphs, buckets, classes, data and steps.
void Run::log_start() {
  const Backbone& backbone = step_.backbone();
  int64_t backbone_params = 0;
  for (const torch::Tensor& p : backbone.parameters()) backbone_params += p.numel();
  const std::string placement = context_.placement(device_);
  const std::string weight_casts =
      c_.precision == Precision::kFp32 ? "" : backbone.weight_casts_note();
  log_info(
      "myriad-train: {}; {}{} (backbone {}, {:.1f}M parameters, {:.2f}G multiply-adds per image, "
      "{}, batch norm in {}{}, {}{}{}, {} gradient buckets{}), {} classes ({} per rank, {}), {}",
      placement, to_string(c_.precision), precision_was_auto_ ? " (--precision auto)" : "",
      c_.backbone, backbone_params / 1e6, backbone.multiply_adds() / 1e9,
      backbone.channels_last() ? "channels-last" : "NCHW",
      batch_norm_kernels(device_, c_.sync_bn, backbone.channels_last()),
      conv_statistics_ ? " with statistics from cuDNN's convolutions" : "", conv_engines_,
      weight_casts.empty() ? "" : ", " + weight_casts,
      graphs_.describe().empty() ? "" : ", " + graphs_.describe(), step_.sync().bucket_count(),
      c_.grad_comm_dtype == torch::kFloat32
          ? ""
          : std::string(", all-reduced in ") + float_dtype_name(c_.grad_comm_dtype),
      data_.classes, step_.classifier().partition().size(context_.rank()),
      step_.classifier().kernels(), c_.margin.describe());
  const DatasetInfo& info = data_.images->info();
  log_info(
      "data {} ({} images {}x{}x{}), global batch {} ({} per {}), {} steps per epoch, {} steps",
      info.name, info.size, info.channels, info.height, info.width, global_batch_, c_.batch_size,
      step_.layout().stages > 1 ? "replica" : "rank", sampler_->steps_per_epoch(), total_steps_);
}

void Run::log_stop(int64_t steps_done) {
  const std::string why = stop_requested()         ? stop_signal_name()
                          : stop_file_.requested() ? "the stop request " + stop_file_.path()
                          : steps_done == c_.stop_at_step
                              ? std::string("--stop-at-step")
                              : std::string("a request another rank received");
  log_info("stopping after step {} ({}); resume with --resume auto", steps_done, why);
}

TrainingState Run::training_state() {
  TrainingState state = step_.state();
  state.config = config_ini_;
  return state;
}

void Run::checkpoint(int64_t steps_done, const DataPosition& next) {
  const LocalWork work("a checkpoint");
  TrainingState state = training_state();
  state.step = steps_done;
  state.position = next;
  // The backbone is saved whole: rank 0 takes the other stages' parts first.
  state.other_stage_states = step_.engine().gather_for_save(step_.optimizer());
  checkpointer_.save(state);
}

torch::Tensor Run::sample_keys(const Batch& batch) const {
  const int64_t first = sampler_->first_key(batch.position, step_.layout().replica);
  return torch::arange(first, first + batch.labels.size(0),
                       torch::dtype(torch::kInt64).device(device_));
}

TrainResult Run::execute() {
  TrainResult result;
  step_.backbone().train();
  observers_.run_started({start_.step, total_steps_});
  for (int64_t step = start_.step; step < total_steps_; ++step) {
    HangWatchdog::instance().step_started(step);
    observers_.step_started({step});
    const auto wait_start = Clock::now();
    Batch batch = loader_->next();
    observers_.batch_ready({step, seconds_since(wait_start)});
    const double factor = schedule_.factor(step);
    step_.set_learning_rates(factor);
    fault_slow_step(context_.rank());

    // The backbone, micro-batch by micro-batch through this rank's stage, on the pipeline's
    // schedule around the classifier; then the gradients' sums and the updates.
    const torch::Tensor loss =
        step_.forward_backward(batch, step_.layout().first() ? sample_keys(batch) : torch::Tensor(),
                               [&] { observers_.before_backward({step}); });
    const torch::Tensor overflow = step_.finish_gradients();
    step_.update(overflow);
    observers_.step_finished({step, total_steps_, batch.position.epoch, loss, c_.lr * factor});
    result.steps = step + 1;

    // Every rank agrees at the same step boundary, whichever got the signal or saw the stop file
    // first.
    const bool stop = !context_.all_true(!stop_requested() && !stop_file_.requested() &&
                                         step + 1 != c_.stop_at_step);
    if (stop && context_.rank() == 0) stop_file_.clear();
    const bool periodic = c_.checkpoint_every > 0 &&
                          ((step + 1) % c_.checkpoint_every == 0 || step + 1 == total_steps_);
    if (stop || periodic) checkpoint(step + 1, batch.next);
    if (stop || step + 1 == total_steps_) {
      // Exit 75, or the end, only with the last checkpoint durable.
      const LocalWork work("a checkpoint");
      checkpointer_.complete();
    }
    if (stop && step + 1 < total_steps_) {
      log_stop(step + 1);
      result.stopped = true;
      return result;
    }
  }
  evaluation_.evaluate(total_steps_, total_steps_ / sampler_->steps_per_epoch());
  result.eval = evaluation_.last();
  progress_.log_done();
  return result;
}

}  // namespace

TrainResult train(ProcessContext& context, const TrainConfig& config, const std::string& config_ini,
                  const std::vector<StepObserver*>& observers) {
  set_torch_threads(config.threads, context.local_size());
  install_stop_handlers();
  // From here on a rank that waits on dead peers ends the job, whatever it is doing.
  const WatchdogSession watchdog(config.hang_timeout);
  Run run(context, config, config_ini, observers);
  // Libraries started by the run (CUDA, NCCL, the MPI transports) may install handlers of their
  // own; a stop signal must still reach the training loop.
  for (const std::string& signal : install_stop_handlers())
    log_warn("a library replaced the {} handler during start-up; restored", signal);
  return run.execute();
}

}  // namespace myriad
