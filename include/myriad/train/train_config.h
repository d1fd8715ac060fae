#pragma once

#include <torch/types.h>
#include <boost/program_options.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "myriad/classifier/margin_config.h"
#include "myriad/model/backbone.h"

namespace myriad {

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
  // The backbone's micro-batches as CUDA graphs (StageGraphs): auto, on, off.
  std::string cuda_graphs = "auto";
  std::string channels_last = "auto";  // auto: on GPUs
  int64_t num_classes = 0;             // 0: from the training data's num_classes attribute
  int64_t synthetic_size = 0;
  int64_t batch_size = 128;  // per replica: per rank with one pipeline stage
  int micro_batches = 1;
  int pipeline_stages = 1;
  std::string pipeline_split;              // "a,b,...": the first blocks of stages 1 ... P-1
  std::string pipeline_schedule = "auto";  // auto, gpipe, 1f1b
  bool pipeline_profile = false;
  int64_t pipeline_memory = 0;  // bytes per GPU for a stage; 0: what the device has left
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: epochs decide
  std::string optimizer = "sgd";
  double lr = 0.1;
  double weight_decay = 5e-4;
  double momentum = 0.9;
  bool nesterov = false;
  double classifier_lr = 0.0;             // 0: --lr
  double classifier_weight_decay = -1.0;  // negative: --weight-decay
  std::string classifier_state_dtype = "fp32";
  std::string classifier_weight_dtype = "fp32";
  int64_t classifier_workspace = 0;  // bytes
  std::string lr_schedule = "poly";
  double poly_power = 2.0;
  std::vector<int64_t> lr_steps;
  double lr_gamma = 0.1;
  int64_t warmup_steps = 0;
  double warmup_epochs = 0.0;      // > 0: warmup_steps from the steps per epoch
  std::string precision = "auto";  // resolve_precision() makes it fp32, bf16 or fp16
  MarginConfig margin;
  double sample_rate = 1.0;
  double grad_clip = 0.0;
  int64_t bucket_bytes = int64_t{25} << 20;
  std::string grad_comm_dtype = "fp32";  // of the gradient all-reduce: fp32, bf16 or fp16
  int64_t log_every = 50;
  int64_t eval_every = 0;  // 0: evaluate at the end only
  int64_t eval_batch_size = 256;
  uint64_t seed = 0;
  bool deterministic = false;
  int threads = 0;  // 0: the node's cores over its ranks
  int workers = 4;
  int prefetch = 4;
  bool random_flip = true;
  std::string device = "auto";
  std::string checkpoint_dir;  // default: RUN_DIR/checkpoints
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 3;
  bool checkpoint_sync = false;        // training waits for each checkpoint to be on disk
  int64_t checkpoint_host_memory = 0;  // bytes for snapshots; 0: one whole snapshot
  std::string resume = "none";
  int64_t stop_at_step = 0;
  double hang_timeout = 600.0;  // seconds; 0: off
  // Steps [profile_first, profile_last] (as the log counts them, from 1) run inside the CUDA
  // profiler's capture range; 0: no capture.
  int64_t profile_first = 0;
  int64_t profile_last = 0;
};

// The options of myriad-train, bound to fields of `config` (margin options included).
boost::program_options::options_description train_options(TrainConfig& config);

// Finishes `config` from parsed `values` (margin, byte sizes, lists) and checks every value; a bad
// one is a UsageError naming the option.
void finish_train_config(const boost::program_options::variables_map& values, TrainConfig& config);

// The effective configuration as an INI file that --config reads back.
std::string config_as_ini(const boost::program_options::variables_map& values);

// A configuration saved as config_as_ini wrote it (RUN_DIR/config.ini, a checkpoint's manifest),
// validated. A bad one is an Error naming `what`.
TrainConfig train_config_from_ini(const std::string& ini, const std::string& what);

// --precision on `device`: auto is bf16 on GPUs that compute in it at full speed, fp32 elsewhere;
// anything else stays as given.
std::string resolve_precision(const std::string& precision, const torch::Device& device);

// The backbone `config` describes.
BackboneOptions backbone_options(const TrainConfig& config);

// Values derived from a configuration: the decisions that myriad-train and myriad-doctor (which
// predicts the run) must take alike.

// Whether --data names generated images ("synthetic", "synthetic-resident") rather than a file.
bool uses_synthetic_data(const TrainConfig& config);
// The classes of synthetic data: --num-classes, or 1,000 without it.
int64_t synthetic_classes(const TrainConfig& config);
// Whether the backbone runs channels-last on `device`: --channels-last, where auto is on GPUs.
bool use_channels_last(const TrainConfig& config, const torch::Device& device);
// The optimizer's tensors per parameter: SGD's momentum, or AdamW's two moments.
int64_t optimizer_states(const TrainConfig& config);
// The bytes a trained parameter holds as a multiple of its own: itself, its gradient and the
// optimizer's states.
double parameter_state_factor(const TrainConfig& config);

}  // namespace myriad
