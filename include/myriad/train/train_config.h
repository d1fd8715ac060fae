#pragma once

#include <torch/types.h>
#include <boost/program_options.hpp>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "myriad/classifier/chunk_plan.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/classifier/shard_optimizer.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/device_selection.h"
#include "myriad/model/backbone.h"
#include "myriad/optim/lr_schedule.h"
#include "myriad/util/device.h"

namespace myriad {

// --precision. kAuto is decided per device (resolve_precision); a run computes in one of the
// others.
enum class Precision { kAuto, kFp32, kBf16, kFp16 };
// A layout or mechanism that auto turns on where it pays: --channels-last, --cuda-graphs,
// --cudnn-benchmark.
enum class Toggle { kAuto, kOn, kOff };
// --pipeline-schedule: one of PipelineSchedule, or kAuto for plan_pipeline's choice.
enum class ScheduleChoice { kAuto, kGPipe, k1F1B, kInterleaved };

// Each value as its option spells it (what config_as_ini writes and logs show).
const char* to_string(Precision precision);
const char* to_string(Toggle toggle);
// --`option`'s value `text` as a Toggle; anything but auto, on or off is a UsageError naming the
// option (the benchmarks' switches parse as myriad-train's).
Toggle parse_toggle(const std::string& option, const std::string& text);
// --fused-update and --fused-classifier as the classifier's choices.
FusedUpdate fused_update_choice(Toggle toggle);
FusedKernels fused_kernels_choice(Toggle toggle);
const char* to_string(ScheduleChoice schedule);
const char* to_string(OptimizerKind optimizer);

// Everything myriad-train is told, after validation.
struct TrainConfig {
  std::string run_dir = "runs/default";
  std::string tensorboard_dir;     // empty: no event files
  std::string data = "synthetic";  // a file, "synthetic" or "synthetic-resident"
  std::string val_data;
  std::vector<std::string> eval_pairs;
  InputShape input;
  std::string backbone = "iresnet50";
  std::string init_backbone;    // a torch.save state dict to start the backbone from
  std::string init_classifier;  // an HDF5 /weight [C, D] to start the classifier from
  bool activation_checkpointing = false;
  int64_t embedding_size = 512;
  double dropout = 0.0;
  bool sync_bn = false;
  // The backbone's micro-batches as CUDA graphs (StageGraphs).
  Toggle cuda_graphs = Toggle::kAuto;
  Toggle channels_last = Toggle::kAuto;  // auto: on GPUs
  // cuDNN's engine for each convolution timed once per shape; auto: on GPUs unless --deterministic.
  Toggle cudnn_benchmark = Toggle::kAuto;
  // Batch norm's statistics formed in the epilogues of the convolutions before them (cuDNN's graph
  // API). Off by default: on an H200 cuDNN's fused engines were slower than its timed plain ones.
  // auto: where the build has it, on GPUs, unless --deterministic.
  Toggle conv_statistics = Toggle::kOff;
  int64_t num_classes = 0;  // 0: from the training data's num_classes attribute
  int64_t synthetic_size = 0;
  int64_t batch_size = 128;  // per replica: per rank with one pipeline stage
  int micro_batches = 1;
  int pipeline_stages = 1;
  std::string pipeline_split;  // "a,b,...": the first blocks of stages 1 ... P-1
  ScheduleChoice pipeline_schedule = ScheduleChoice::kAuto;
  int virtual_stages = 2;  // chunks per stage, under the interleaved schedule
  bool pipeline_profile = false;
  int64_t pipeline_memory = 0;  // bytes per GPU for a stage; 0: what the device has left
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: epochs decide
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double lr = 0.1;
  double weight_decay = 5e-4;
  double momentum = 0.9;
  bool nesterov = false;
  double classifier_lr = 0.0;                                   // 0: --lr
  double classifier_weight_decay = -1.0;                        // negative: --weight-decay
  torch::ScalarType classifier_state_dtype = torch::kFloat32;   // or bfloat16
  torch::ScalarType classifier_weight_dtype = torch::kFloat32;  // or bfloat16
  int64_t classifier_workspace = 0;                             // bytes
  // The classifier's fused Hopper kernels: auto where they apply, on (an error elsewhere), off.
  Toggle fused_classifier = Toggle::kAuto;
  // SGD's update of bf16 rows fused with their gradient (FusedUpdate): auto, on, off.
  Toggle fused_update = Toggle::kAuto;
  LrScheduleKind lr_schedule = LrScheduleKind::kPoly;
  double poly_power = 2.0;
  std::vector<int64_t> lr_steps;
  double lr_gamma = 0.1;
  int64_t warmup_steps = 0;
  double warmup_epochs = 0.0;              // > 0: warmup_steps from the steps per epoch
  Precision precision = Precision::kAuto;  // resolve_precision() decides auto
  MarginConfig margin;
  double sample_rate = 1.0;
  double grad_clip = 0.0;
  int64_t bucket_bytes = int64_t{25} << 20;
  torch::ScalarType grad_comm_dtype = torch::kFloat32;  // of the gradient all-reduce
  int64_t log_every = 50;
  int64_t eval_every = 0;  // 0: evaluate at the end only
  int64_t eval_batch_size = 256;
  uint64_t seed = 0;
  bool deterministic = false;
  int threads = 0;  // 0: the node's cores over its ranks
  int workers = 4;
  int prefetch = 4;
  bool random_flip = true;
  DevicePreference device = DevicePreference::kAuto;
  std::string checkpoint_dir;  // default: RUN_DIR/checkpoints
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 3;
  bool checkpoint_sync = false;        // training waits for each checkpoint to be on disk
  int64_t checkpoint_host_memory = 0;  // bytes for snapshots; 0: one whole snapshot
  std::string resume = "none";         // none, auto or a checkpoint directory
  int64_t stop_at_step = 0;
  double hang_timeout = 600.0;  // seconds; 0: off
  // Steps [profile_first, profile_last] (as the log counts them, from 1) run inside the CUDA
  // profiler's capture range; 0: no capture.
  int64_t profile_first = 0;
  int64_t profile_last = 0;
  // Where rank 0 writes the profiled steps' timeline of every rank (Chrome's trace format);
  // empty: none.
  std::string timeline;
};

// The options of myriad-train, bound to fields of `config` (margin options included).
boost::program_options::options_description train_options(TrainConfig& config);

// Finishes `config` from parsed `values` (margin, byte sizes, lists, the choices as enums) and
// checks every value; a bad one is a UsageError naming the option.
void finish_train_config(const boost::program_options::variables_map& values, TrainConfig& config);

// The effective configuration as an INI file that --config reads back.
std::string config_as_ini(const boost::program_options::variables_map& values);

// A configuration saved as config_as_ini wrote it (RUN_DIR/config.ini, a checkpoint's manifest),
// validated. A bad one is an Error naming `what`.
TrainConfig train_config_from_ini(const std::string& ini, const std::string& what);

// `text` as --precision, one of `allowed`; anything else is a UsageError naming the option, the
// choices and `text`.
Precision parse_precision(const std::string& text, std::initializer_list<Precision> allowed);

// --precision where bfloat16 does (`fast_bfloat16`) or does not compute at full speed: auto is
// bf16 or fp32; anything else stays as given.
Precision resolve_precision(Precision precision, bool fast_bfloat16);
// --precision on `device`: auto is bf16 on GPUs that compute in it at full speed, fp32 elsewhere.
// fp16, whose dynamic loss scaling runs on GPUs only, is an error on the CPU.
Precision resolve_precision(Precision precision, const torch::Device& device);

// How `device`'s convolutions pick their algorithms under --deterministic and --cudnn-benchmark
// (use_convolution_engines sets it): timed per shape on GPUs unless off or deterministic. `on`
// without GPUs is an error (collective check).
ConvolutionEngines convolution_engines(bool deterministic, Toggle cudnn_benchmark,
                                       const torch::Device& device);
// What decides whether a run's batch norms take their statistics from its convolutions.
struct ConvStatisticsRequest {
  Toggle toggle = Toggle::kOff;  // --conv-statistics
  bool deterministic = false;
  Precision precision = Precision::kFp32;  // resolved
  bool channels_last = false;              // resolved (use_channels_last)
  bool sync_bn = false;
};
// The request of a run of `config` (precision resolved) on `device`.
ConvStatisticsRequest conv_statistics_request(const TrainConfig& config,
                                              const torch::Device& device);
// Whether --conv-statistics forms batch norm's statistics in the convolutions
// (use_convolution_statistics sets it): with 16-bit channels-last maps and per-rank batch norm on
// GPUs of a build with cuDNN's graph API, unless off or deterministic. `on` where it cannot is an
// error that says why (collective check).
bool convolution_statistics(const ConvStatisticsRequest& request, const torch::Device& device);
// The dtype a resolved precision computes in: what its GEMMs take.
torch::ScalarType compute_dtype(Precision precision);
// The autocast dtype of a resolved precision: none for fp32.
std::optional<torch::ScalarType> autocast_dtype(Precision precision);

// The backbone `config` describes.
BackboneOptions backbone_options(const TrainConfig& config);

// Values derived from a configuration: the decisions that myriad-train, myriad-doctor (which
// predicts the run) and myriad-embed must take alike.

// The backbone a run of `config` on `device` trains, as built before its pipeline places it:
// activation checkpointing as configured, and channels-last by use_channels_last (set before any
// profile, which must time the layout that trains). Its initial weights come from torch's
// generator, which the caller seeds.
std::shared_ptr<Backbone> training_backbone(const TrainConfig& config, const torch::Device& device);

// Whether --data names generated images ("synthetic", "synthetic-resident") rather than a file.
bool uses_synthetic_data(const TrainConfig& config);
// The classes of synthetic data: --num-classes, or 1,000 without it.
int64_t synthetic_classes(const TrainConfig& config);
// Whether a backbone runs channels-last on `device` by --channels-last `choice`: auto is on GPUs,
// where cuDNN's NHWC kernels are the fast ones.
bool use_channels_last(Toggle choice, const torch::Device& device);
// The optimizer's tensors per parameter: SGD's momentum, or AdamW's two moments.
int64_t optimizer_states(const TrainConfig& config);
// The bytes a trained parameter holds as a multiple of its own: itself, its gradient and the
// optimizer's states.
double parameter_state_factor(const TrainConfig& config);

}  // namespace myriad
