#include "myriad/train/train_config.h"

#include <algorithm>
#include <array>
#include <optional>
#include <sstream>
#include <type_traits>

#include "myriad/model/batch_norm.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"

namespace myriad {

namespace {

std::vector<int64_t> parse_step_list(const std::string& text) {
  std::vector<int64_t> steps;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      steps.push_back(std::stoll(item, &used));
      if (used != item.size() || steps.back() <= 0) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError(
          str_format("--lr-steps must be a comma list of positive steps, got '{}'", text));
    }
    if (steps.size() > 1 && steps.back() <= steps[steps.size() - 2]) {
      throw UsageError(str_format("--lr-steps must increase, got '{}'", text));
    }
  }
  return steps;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// The choices of each option, in the order its errors list them.
constexpr std::array<Precision, 4> kPrecisions = {Precision::kAuto, Precision::kFp32,
                                                  Precision::kBf16, Precision::kFp16};
constexpr std::array<Toggle, 3> kToggles = {Toggle::kAuto, Toggle::kOn, Toggle::kOff};
constexpr std::array<ScheduleChoice, 4> kSchedules = {ScheduleChoice::kAuto, ScheduleChoice::kGPipe,
                                                      ScheduleChoice::k1F1B,
                                                      ScheduleChoice::kInterleaved};
constexpr std::array<OptimizerKind, 2> kOptimizers = {OptimizerKind::kSgd, OptimizerKind::kAdamW};
constexpr std::array<LrScheduleKind, 3> kLrSchedules = {
    LrScheduleKind::kPoly, LrScheduleKind::kCosine, LrScheduleKind::kStep};
const std::array<torch::ScalarType, 3> kCommDtypes = {torch::kFloat32, torch::kBFloat16,
                                                      torch::kFloat16};
// The classifier's kernels keep weights and optimizer states in these only.
const std::array<torch::ScalarType, 2> kClassifierDtypes = {torch::kFloat32, torch::kBFloat16};

// A choice as its option spells it.
const char* name_of(torch::ScalarType dtype) {
  return float_dtype_name(dtype);
}
template <class Enum>
const char* name_of(Enum value) {
  return to_string(value);
}

// "--option must be a, b or c".
template <class Choices>
std::string must_be(const std::string& option, const Choices& allowed) {
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) list += i + 1 < allowed.size() ? ", " : " or ";
    list += name_of(*(allowed.begin() + i));
  }
  return str_format("--{} must be {}", option, list);
}

// The one of `allowed` that `text` spells, if any.
template <class Choices>
auto find_choice(const std::string& text, const Choices& allowed)
    -> std::optional<std::decay_t<decltype(*allowed.begin())>> {
  for (const auto value : allowed) {
    if (text == name_of(value)) return value;
  }
  return std::nullopt;
}

// `text`, the value of --`option`, as one of `allowed`; anything else is a UsageError.
template <class Choices>
auto parse_choice(const std::string& option, const std::string& text, const Choices& allowed) {
  const auto value = find_choice(text, allowed);
  require(value.has_value(), str_format("{}, got '{}'", must_be(option, allowed), text));
  return *value;
}

// The choice that --`option` gives in `values`.
template <class Choices>
auto choice(const po::variables_map& values, const std::string& option, const Choices& allowed) {
  return parse_choice(option, values[option].as<std::string>(), allowed);
}

// The dtype that --`option` gives the classifier, whose error lists the choices only.
torch::ScalarType classifier_dtype(const po::variables_map& values, const std::string& option) {
  const auto dtype = find_choice(values[option].as<std::string>(), kClassifierDtypes);
  require(dtype.has_value(), must_be(option, kClassifierDtypes));
  return *dtype;
}

// The run's inputs and outputs, and the backbone.
void add_input_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("config", po::value<std::string>(), "INI file of options (key = value); the command line overrides it")
      ("run-dir", po::value(&c.run_dir)->default_value(c.run_dir), "directory for the configuration, metrics.jsonl and logs")
      ("tensorboard-dir", po::value(&c.tensorboard_dir), "also write every logged number as a TensorBoard scalar into this directory")
      ("data", po::value(&c.data)->default_value(c.data), "training data: an HDF5 file (docs/data-format.md), 'synthetic', or 'synthetic-resident' (one synthetic batch kept on the device: the trainer's speed without loading, for benchmarks)")
      ("val-data", po::value(&c.val_data), "labelled HDF5 file for top-1 and kNN evaluation")
      ("eval-pairs", po::value(&c.eval_pairs)->multitoken(), "HDF5 verification pair files (10-fold accuracy, LFW protocol)")
      ("input-shape", po::value<std::string>()->default_value("3x112x112"), "image shape CxHxW the backbone takes")
      ("backbone", po::value(&c.backbone)->default_value(c.backbone), "r18, r34, r50, r100, r200 (also called iresnet18 ... iresnet200), mbf, vit_t, vit_s, vit_b, vit_l, vit_h (insightface arcface_torch's networks, under its parameter names), mobilefacenet or smallcnn")
      ("init-backbone", po::value(&c.init_backbone), "start the backbone from this torch.save state dict (an insightface model-zoo .pth, an arcface_torch checkpoint, or myriad-ckpt export-backbone's file); read as data, never run")
      ("init-classifier", po::value(&c.init_classifier), "start the classifier from this HDF5 file of /weight [C, D] (myriad-ckpt merge-classifier writes one)")
      ("activation-checkpointing", po::bool_switch(&c.activation_checkpointing), "keep only each block's input in forward and recompute it in backward: less memory, about a third more compute")
      ("embedding-size", po::value(&c.embedding_size)->default_value(c.embedding_size), "embedding dimension D")
      ("dropout", real_option(&c.dropout), "dropout before the embedding layer")
      ("channels-last", po::value<std::string>()->default_value(name_of(c.channels_last)), "convolutions in channels-last (NHWC) layout: auto (on GPUs, where cuDNN's NHWC kernels are the fast ones), on or off")
      ("sync-bn", po::bool_switch(&c.sync_bn), "batch norm over the global batch (SyncBN): training does not depend on how the batch is split")
      ("cuda-graphs", po::value<std::string>()->default_value(name_of(c.cuda_graphs)), "on: record the backbone's forward and backward of a micro-batch as CUDA graphs once and replay them, with no per-kernel launch cost on the host, which dominates deep backbones at small micro-batches, and the gradient all-reduce overlapped inside the replayed backward (GPUs; not with --sync-bn or --activation-checkpointing); auto: on GPUs where they may run, whichever of eager steps and graphs the first steps measure faster; off. A recording that runs out of memory goes on eagerly");
  // clang-format on
}

// Classes, batches, pipeline stages and the length of the run.
void add_scale_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("num-classes", count_option(&c.num_classes), "classes C (default: the data's num_classes attribute)")
      ("synthetic-size", count_option(&c.synthetic_size), "images of --data synthetic (default: 64 per class, at least one epoch of 100 steps)")
      ("batch-size", count_option(&c.batch_size), "samples per replica and step: per rank with one pipeline stage")
      ("micro-batches", po::value(&c.micro_batches)->default_value(c.micro_batches), "micro-batches per step: gradient accumulation, and what pipeline stages overlap (must divide --batch-size)")
      ("pipeline-stages", po::value(&c.pipeline_stages)->default_value(c.pipeline_stages), "cut the backbone into this many consecutive stages on neighbouring ranks (must divide the ranks; docs/pipeline.md)")
      ("pipeline-split", po::value(&c.pipeline_split), "the first block of each stage after the first, e.g. 26,52,78 (default: the fastest cut, from a profile of every block)")
      ("pipeline-schedule", po::value<std::string>()->default_value(name_of(c.pipeline_schedule)), "gpipe (all forwards, then all backwards: fastest), 1f1b (stage s holds min(P - s, M) micro-batches: the most memory left), interleaved (Megatron-LM's interleaved 1F1B: each stage holds --virtual-stages chunks of the backbone, and the bubble shrinks by as much), or auto: gpipe unless the profile says its micro-batches do not fit")
      ("virtual-stages", po::value(&c.virtual_stages)->default_value(c.virtual_stages), "under --pipeline-schedule interleaved, the chunks of the backbone each stage holds (2 or more): a micro-batch passes every stage that many times")
      ("pipeline-profile", po::bool_switch(&c.pipeline_profile), "log every block's profiled time and memory, and the cut's predicted stage times (also with one stage)")
      ("pipeline-memory", po::value<std::string>()->default_value("0"), "memory a stage may use per GPU (e.g. 70G; 0: what the device has left after the classifier)")
      ("epochs", count_option(&c.epochs), "passes over the training data")
      ("max-steps", count_option(&c.max_steps), "stop after this many steps (0: --epochs decides)");
  // clang-format on
}

// The optimizer, the classifier's numbers and the learning-rate schedule.
void add_optimizer_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("optimizer", po::value<std::string>()->default_value(name_of(c.optimizer)), "sgd or adamw, for the backbone and the classifier")
      ("lr", real_option(&c.lr), "peak learning rate")
      ("weight-decay", real_option(&c.weight_decay), "weight decay")
      ("momentum", real_option(&c.momentum), "SGD momentum")
      ("nesterov", po::bool_switch(&c.nesterov), "Nesterov momentum")
      ("classifier-lr", po::value(&c.classifier_lr)->default_value(0.0), "peak learning rate of the classifier (default: --lr)")
      ("classifier-weight-decay", po::value(&c.classifier_weight_decay)->default_value(-1.0), "classifier weight decay (default: --weight-decay)")
      ("classifier-state-dtype", po::value<std::string>()->default_value(name_of(c.classifier_state_dtype)), "classifier optimizer state: fp32 or bf16")
      ("classifier-weight-dtype", po::value<std::string>()->default_value(name_of(c.classifier_weight_dtype)), "classifier weights: fp32, or bf16 updated with stochastic rounding (half the memory)")
      ("classifier-workspace", po::value<std::string>()->default_value("2G"), "memory budget of the classifier's chunks (e.g. 512M, 8G)")
      ("fused-classifier", po::value<std::string>()->default_value(name_of(c.fused_classifier)), "the classifier's fused kernels, logits never in memory: auto (where they apply: H100 and H200 GPUs, bf16 precision, --embedding-size a multiple of 8 up to 512), on (an error elsewhere) or off")
      ("fused-update", po::value<std::string>()->default_value(name_of(c.fused_update)), str_format("SGD's update of bf16 classifier rows formed from the logits' gradient in one kernel, where the fused kernels run: auto (at global batches up to {}, where it measures faster), on (every batch; an error where it cannot run) or off", kFusedUpdateAutoMaxBatch).c_str())
      ("lr-schedule", po::value<std::string>()->default_value(name_of(c.lr_schedule)), "poly, cosine or step, after the warmup")
      ("poly-power", real_option(&c.poly_power), "exponent of the poly schedule")
      ("lr-steps", po::value<std::string>(), "steps at which the step schedule multiplies the rate by --lr-gamma (e.g. 10000,20000)")
      ("lr-gamma", real_option(&c.lr_gamma), "factor of the step schedule")
      ("warmup-steps", count_option(&c.warmup_steps), "linear warmup from 0 to --lr")
      ("warmup-epochs", real_option(&c.warmup_epochs), "linear warmup over this many epochs (may be fractional); replaces --warmup-steps");
  // clang-format on
}

// Precision, sampling, gradients' communication, logging and evaluation.
void add_numerics_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("precision", po::value<std::string>()->default_value(name_of(c.precision)), "auto (bf16 on GPUs of compute capability 8.0 or later, fp32 on the CPU and older GPUs), fp32, bf16 (autocast) or fp16 (autocast and dynamic loss scaling)")
      ("sample-rate", real_option(&c.sample_rate), "Partial FC: fraction of negative classes per step, in (0, 1]")
      ("grad-clip", real_option(&c.grad_clip), "clip the backbone gradient's global norm to this (0: off)")
      ("bucket-size", po::value<std::string>()->default_value("25M"), "gradient all-reduce bucket size (bytes, e.g. 25M)")
      ("grad-comm-dtype", po::value<std::string>()->default_value(name_of(c.grad_comm_dtype)), "dtype of the gradient all-reduce: fp32, or bf16/fp16 to halve the bytes on slow links between hosts (summed in that dtype, then cast back)")
      ("log-every", count_option(&c.log_every), "log and record metrics every this many steps")
      ("eval-every", count_option(&c.eval_every), "evaluate every this many steps (0: at the end only)")
      ("eval-batch-size", count_option(&c.eval_batch_size), "samples per rank and evaluation batch")
      ("seed", po::value(&c.seed)->default_value(0), "seed of initialisation, sampling and augmentation");
  // clang-format on
}

// How kernels are chosen, threads, the loader and the device.
void add_engine_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("deterministic", po::bool_switch(&c.deterministic), "deterministic cuDNN and cuBLAS: a run repeats bit for bit on the same GPUs and ranks (slower)")
      ("cudnn-benchmark", po::value<std::string>()->default_value(name_of(c.cudnn_benchmark)), "on: cuDNN times the engines of each convolution shape once, in the first step, and keeps the fastest (GPUs; not with --deterministic); auto: on GPUs unless --deterministic; off: cuDNN's heuristics choose")
      ("conv-statistics", po::value<std::string>()->default_value(name_of(c.conv_statistics)), "on: each convolution followed by a batch norm also forms its output's per-channel sums in cuDNN's epilogue, and the batch norm reads the output once less (GPUs, a build with cuDNN's graph API, bf16 or fp16, channels-last, per-rank batch norm; not with --deterministic; an error after the first step where no convolution formed them); auto: wherever it can; off (the default, faster on an H200: docs/benchmarks.md): the batch norm's statistics pass")
      ("threads", po::value(&c.threads)->default_value(0), "CPU threads per rank for LibTorch (0: cores over ranks on the node)")
      ("workers", po::value(&c.workers)->default_value(c.workers), "data loader threads per rank")
      ("prefetch", po::value(&c.prefetch)->default_value(c.prefetch), "batches the loader prepares ahead")
      ("no-flip", po::bool_switch(), "no random horizontal flip")
      ("device", po::value<std::string>()->default_value(name_of(c.device)), "auto, cpu or cuda");
  // clang-format on
}

// Checkpoints, resumption, stops, hangs and profiling.
void add_checkpoint_options(po::options_description& options, TrainConfig& c) {
  // clang-format off
  options.add_options()
      ("checkpoint-dir", po::value(&c.checkpoint_dir), "where checkpoints go (default: RUN_DIR/checkpoints)")
      ("checkpoint-every", count_option(&c.checkpoint_every), "write a checkpoint every this many steps, and at the end (0: only when stopped by a signal)")
      ("checkpoint-keep", po::value(&c.checkpoint_keep)->default_value(c.checkpoint_keep), "how many checkpoints to keep")
      ("checkpoint-sync", po::bool_switch(&c.checkpoint_sync), "training waits until each checkpoint is on disk (default: a snapshot in host memory, written in the background)")
      ("checkpoint-host-memory", po::value<std::string>()->default_value("auto"), "host memory per rank for checkpoint snapshots (e.g. 8G); a smaller one streams each checkpoint through it while training waits (auto: one whole snapshot)")
      ("resume", po::value(&c.resume)->default_value(c.resume), "none, auto (the newest valid checkpoint of --checkpoint-dir; fresh when there is none) or a checkpoint directory")
      ("stop-at-step", count_option(&c.stop_at_step), "checkpoint and exit (code 75) after this step, as a signal would (0: off)")
      ("hang-timeout", real_option(&c.hang_timeout), "seconds a rank may wait on the others in one collective, or go without starting a step, before it logs what it waited for and aborts the whole job (0: off; docs/multi-node.md)")
      ("profile-steps", po::value<std::string>(), "FIRST:LAST: run steps FIRST to LAST inside the CUDA profiler's capture range, for nsys --capture-range=cudaProfilerApi or ncu --profile-from-start off (GPUs only, unless with --timeline)")
      ("timeline", po::value(&c.timeline), "FILE: write every rank's forward, backward, classifier and transfers of the --profile-steps steps, per micro-batch, as one Chrome trace (JSON, for ui.perfetto.dev or chrome://tracing)");
  // clang-format on
}

}  // namespace

po::options_description train_options(TrainConfig& c) {
  po::options_description options("myriad-train options");
  add_input_options(options, c);
  add_scale_options(options, c);
  add_optimizer_options(options, c);
  add_numerics_options(options, c);
  add_engine_options(options, c);
  add_checkpoint_options(options, c);
  add_margin_options(options);
  return options;
}

namespace {

// The options given as text that are not choices: shapes, byte sizes, lists, step ranges, and the
// defaults that other options decide.
void read_text_options(const po::variables_map& values, TrainConfig& c) {
  c.input = parse_input_shape(values["input-shape"].as<std::string>());
  c.margin = margin_from_options(values);
  c.classifier_workspace = parse_byte_size(values["classifier-workspace"].as<std::string>());
  c.bucket_bytes = parse_byte_size(values["bucket-size"].as<std::string>());
  c.pipeline_memory = parse_byte_size(values["pipeline-memory"].as<std::string>());
  if (const std::string memory = values["checkpoint-host-memory"].as<std::string>();
      memory != "auto") {
    c.checkpoint_host_memory = parse_byte_size(memory);
    // Two of the writer's smallest buffers (SnapshotWriter::buffer_bytes).
    require(c.checkpoint_host_memory >= (int64_t{128} << 10),
            "--checkpoint-host-memory must be at least 128K");
  }
  if (values.count("lr-steps") > 0)
    c.lr_steps = parse_step_list(values["lr-steps"].as<std::string>());
  if (values.count("profile-steps") > 0) {
    const std::string text = values["profile-steps"].as<std::string>();
    const size_t colon = text.find(':');
    // -1 for what is not a count: below 1, refused.
    const int64_t first =
        colon == std::string::npos ? -1 : try_parse_count(text.substr(0, colon)).value_or(-1);
    const int64_t last =
        colon == std::string::npos ? -1 : try_parse_count(text.substr(colon + 1)).value_or(-1);
    require(
        first >= 1 && last >= first,
        str_format("--profile-steps must be FIRST:LAST with 1 <= FIRST <= LAST, got '{}'", text));
    c.profile_first = first;
    c.profile_last = last;
  }
  require(c.timeline.empty() || c.profile_first > 0,
          "--timeline needs --profile-steps FIRST:LAST, the steps it records");
  // Each traced step keeps a few hundred CUDA events until the timeline is written.
  constexpr int64_t kTimelineSteps = 100;
  require(c.timeline.empty() || c.profile_last - c.profile_first < kTimelineSteps,
          str_format("--timeline records at most {} steps, and --profile-steps {}:{} spans {}",
                     kTimelineSteps, c.profile_first, c.profile_last,
                     c.profile_last - c.profile_first + 1));
  c.random_flip = !values["no-flip"].as<bool>();
  if (c.classifier_lr == 0.0) c.classifier_lr = c.lr;
  if (c.classifier_weight_decay < 0.0) c.classifier_weight_decay = c.weight_decay;
}

// The interleaved schedule's shape: what Megatron-LM's interleaved order runs.
void finish_interleaved_options(const TrainConfig& c) {
  if (c.pipeline_schedule != ScheduleChoice::kInterleaved) {
    require(c.virtual_stages == TrainConfig().virtual_stages,
            "--virtual-stages needs --pipeline-schedule interleaved");
    return;
  }
  require(c.pipeline_stages >= 2,
          "--pipeline-schedule interleaved needs --pipeline-stages 2 or more");
  require(c.virtual_stages >= 2, "--virtual-stages must be 2 or more");
  require(c.micro_batches % c.pipeline_stages == 0,
          str_format("--pipeline-schedule interleaved runs the micro-batches in groups of one per "
                     "stage: --micro-batches {} is not a multiple of --pipeline-stages {}",
                     c.micro_batches, c.pipeline_stages));
  require(c.cuda_graphs != Toggle::kOn,
          "--cuda-graphs on and --pipeline-schedule interleaved exclude each other (a stage's "
          "chunks are not recorded)");
}

// The model's, the batch's and the pipeline's options: choices parsed, values checked.
void finish_model_options(const po::variables_map& values, TrainConfig& c) {
  require(!c.run_dir.empty(), "--run-dir must not be empty");
  require(std::find(backbone_names().begin(), backbone_names().end(), c.backbone) !=
              backbone_names().end(),
          str_format("unknown --backbone '{}'", c.backbone));
  c.channels_last = choice(values, "channels-last", kToggles);
  require(c.embedding_size > 0, "--embedding-size must be positive");
  require(c.dropout >= 0.0 && c.dropout < 1.0, "--dropout must be in [0, 1)");
  require(c.num_classes >= 0, "--num-classes must be positive");
  require(c.synthetic_size >= 0, "--synthetic-size must be positive");
  require(c.batch_size > 0, "--batch-size must be positive");
  require(c.micro_batches > 0, "--micro-batches must be positive");
  require(c.batch_size % c.micro_batches == 0,
          str_format("--micro-batches {} does not divide --batch-size {}", c.micro_batches,
                     c.batch_size));
  require(c.pipeline_stages > 0, "--pipeline-stages must be positive");
  require(c.pipeline_split.empty() || c.pipeline_stages > 1,
          "--pipeline-split needs --pipeline-stages 2 or more");
  c.cuda_graphs = choice(values, "cuda-graphs", kToggles);
  require(c.cuda_graphs != Toggle::kOn || !c.sync_bn,
          "--cuda-graphs on and --sync-bn exclude each other (SyncBN's all-reduces are not "
          "recorded)");
  require(c.cuda_graphs != Toggle::kOn || !c.activation_checkpointing,
          "--cuda-graphs on and --activation-checkpointing exclude each other");
  c.pipeline_schedule = choice(values, "pipeline-schedule", kSchedules);
  finish_interleaved_options(c);
}

// The optimizer's, the run's and the checkpoints' options: choices parsed, values checked.
void finish_training_options(const po::variables_map& values, TrainConfig& c) {
  require(c.epochs > 0, "--epochs must be positive");
  require(c.max_steps >= 0, "--max-steps must not be negative");
  c.optimizer = choice(values, "optimizer", kOptimizers);
  require(c.lr > 0.0 && c.classifier_lr > 0.0, "learning rates must be positive");
  require(c.weight_decay >= 0.0, "--weight-decay must not be negative");
  require(c.momentum >= 0.0 && c.momentum < 1.0, "--momentum must be in [0, 1)");
  c.classifier_state_dtype = classifier_dtype(values, "classifier-state-dtype");
  c.classifier_weight_dtype = classifier_dtype(values, "classifier-weight-dtype");
  require(c.classifier_workspace > 0, "--classifier-workspace must be positive");
  c.fused_classifier = choice(values, "fused-classifier", kToggles);
  c.fused_update = choice(values, "fused-update", kToggles);
  c.cudnn_benchmark = choice(values, "cudnn-benchmark", kToggles);
  require(c.cudnn_benchmark != Toggle::kOn || !c.deterministic,
          "--cudnn-benchmark on and --deterministic exclude each other (the timed engines need "
          "not repeat bit for bit)");
  c.conv_statistics = choice(values, "conv-statistics", kToggles);
  require(c.conv_statistics != Toggle::kOn || !c.deterministic,
          "--conv-statistics on and --deterministic exclude each other (cuDNN's sums are not "
          "added in a fixed order)");
  c.lr_schedule = choice(values, "lr-schedule", kLrSchedules);
  require(c.poly_power > 0.0, "--poly-power must be positive");
  require(c.lr_gamma > 0.0, "--lr-gamma must be positive");
  require(c.lr_schedule != LrScheduleKind::kStep || !c.lr_steps.empty(),
          "--lr-schedule step needs --lr-steps");
  require(c.warmup_steps >= 0, "--warmup-steps must not be negative");
  require(c.warmup_epochs >= 0.0, "--warmup-epochs must not be negative");
  require(c.warmup_epochs == 0.0 || c.warmup_steps == 0,
          "--warmup-epochs and --warmup-steps exclude each other");
  c.precision = choice(values, "precision", kPrecisions);
  require(c.sample_rate > 0.0 && c.sample_rate <= 1.0, "--sample-rate must be in (0, 1]");
  require(c.grad_clip >= 0.0, "--grad-clip must not be negative");
  require(c.bucket_bytes > 0, "--bucket-size must be positive");
  require(c.log_every > 0, "--log-every must be positive");
  require(c.eval_every >= 0, "--eval-every must not be negative");
  require(c.eval_batch_size > 0, "--eval-batch-size must be positive");
  require(c.threads >= 0, "--threads must not be negative");
  require(c.workers > 0 && c.prefetch > 0, "--workers and --prefetch must be positive");
  c.device = choice(values, "device", kDevicePreferences);
  if (c.checkpoint_dir.empty()) c.checkpoint_dir = c.run_dir + "/checkpoints";
  require(c.checkpoint_every >= 0, "--checkpoint-every must not be negative");
  require(c.checkpoint_keep > 0, "--checkpoint-keep must be positive");
  require(!c.resume.empty(), "--resume must be none, auto or a checkpoint directory");
  require(c.stop_at_step >= 0, "--stop-at-step must not be negative");
  require(c.hang_timeout >= 0, "--hang-timeout must not be negative");
  c.grad_comm_dtype = choice(values, "grad-comm-dtype", kCommDtypes);
}

}  // namespace

void finish_train_config(const po::variables_map& values, TrainConfig& c) {
  read_text_options(values, c);
  finish_model_options(values, c);
  finish_training_options(values, c);
}

std::string config_as_ini(const po::variables_map& values) {
  std::ostringstream out;
  for (const auto& [key, value] : values) {
    if (key == "config" || value.empty()) continue;
    const boost::any& v = value.value();
    if (const auto* list = boost::any_cast<std::vector<std::string>>(&v)) {
      // A repeated key is how an INI file gives a list.
      for (const std::string& item : *list) out << key << " = " << item << "\n";
      continue;
    }
    out << key << " = ";
    if (const auto* s = boost::any_cast<std::string>(&v)) {
      out << *s;
    } else if (const auto* i = boost::any_cast<int64_t>(&v)) {
      out << *i;
    } else if (const auto* u = boost::any_cast<uint64_t>(&v)) {
      out << *u;
    } else if (const auto* n = boost::any_cast<int>(&v)) {
      out << *n;
    } else if (const auto* d = boost::any_cast<double>(&v)) {
      out << *d;
    } else if (const auto* b = boost::any_cast<bool>(&v)) {
      out << (*b ? "true" : "false");
    }
    out << "\n";
  }
  return out.str();
}

TrainConfig train_config_from_ini(const std::string& ini, const std::string& what) {
  TrainConfig config;
  const po::options_description options = train_options(config);
  po::variables_map values;
  std::istringstream in(ini);
  try {
    po::store(po::parse_config_file(in, options, /*allow_unregistered=*/true), values);
    po::notify(values);
    finish_train_config(values, config);
  } catch (const po::error& e) {
    MYRIAD_THROW("{}: a configuration myriad cannot read: {}", what, e.what());
  } catch (const UsageError& e) {
    MYRIAD_THROW("{}: a configuration myriad cannot read: {}", what, e.message());
  }
  return config;
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kAuto:
      return "auto";
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  MYRIAD_THROW("no Precision {}", static_cast<int>(precision));
}

const char* to_string(Toggle toggle) {
  switch (toggle) {
    case Toggle::kAuto:
      return "auto";
    case Toggle::kOn:
      return "on";
    case Toggle::kOff:
      return "off";
  }
  MYRIAD_THROW("no Toggle {}", static_cast<int>(toggle));
}

Toggle parse_toggle(const std::string& option, const std::string& text) {
  return parse_choice(option, text, kToggles);
}

FusedKernels fused_kernels_choice(Toggle toggle) {
  return toggle == Toggle::kOn    ? FusedKernels::kRequired
         : toggle == Toggle::kOff ? FusedKernels::kOff
                                  : FusedKernels::kAuto;
}

FusedUpdate fused_update_choice(Toggle toggle) {
  return toggle == Toggle::kOn    ? FusedUpdate::kOn
         : toggle == Toggle::kOff ? FusedUpdate::kOff
                                  : FusedUpdate::kAuto;
}

const char* to_string(ScheduleChoice schedule) {
  switch (schedule) {
    case ScheduleChoice::kAuto:
      return "auto";
    case ScheduleChoice::kGPipe:
      return "gpipe";
    case ScheduleChoice::k1F1B:
      return "1f1b";
    case ScheduleChoice::kInterleaved:
      return "interleaved";
  }
  MYRIAD_THROW("no ScheduleChoice {}", static_cast<int>(schedule));
}

const char* to_string(OptimizerKind optimizer) {
  switch (optimizer) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  MYRIAD_THROW("no OptimizerKind {}", static_cast<int>(optimizer));
}

Precision parse_precision(const std::string& text, std::initializer_list<Precision> allowed) {
  return parse_choice("precision", text, allowed);
}

Precision resolve_precision(Precision precision, bool fast_bfloat16) {
  if (precision != Precision::kAuto) return precision;
  return fast_bfloat16 ? Precision::kBf16 : Precision::kFp32;
}

Precision resolve_precision(Precision precision, const torch::Device& device) {
  MYRIAD_CHECK_COLLECTIVE(precision != Precision::kFp16 || device.is_cuda(),
                          "--precision fp16 needs GPUs");
  return resolve_precision(precision, has_fast_bfloat16(device));
}

ConvolutionEngines convolution_engines(bool deterministic, Toggle cudnn_benchmark,
                                       const torch::Device& device) {
  MYRIAD_CHECK_COLLECTIVE(cudnn_benchmark != Toggle::kOn || device.is_cuda(),
                          "--cudnn-benchmark on needs GPUs");
  if (deterministic) return ConvolutionEngines::kDeterministic;
  return device.is_cuda() && cudnn_benchmark != Toggle::kOff ? ConvolutionEngines::kTimed
                                                             : ConvolutionEngines::kHeuristic;
}

ConvStatisticsRequest conv_statistics_request(const TrainConfig& config,
                                              const torch::Device& device) {
  return {config.conv_statistics, config.deterministic, config.precision,
          use_channels_last(config.channels_last, device), config.sync_bn};
}

bool convolution_statistics(const ConvStatisticsRequest& r, const torch::Device& device) {
  const bool half = r.precision == Precision::kBf16 || r.precision == Precision::kFp16;
  if (r.toggle == Toggle::kOn) {
    // The options' conflict first: it holds whatever the machine.
    MYRIAD_CHECK_COLLECTIVE(!r.sync_bn,
                            "--conv-statistics on and --sync-bn exclude each other (SyncBN sums "
                            "the statistics over every rank in a pass of its own)");
    MYRIAD_CHECK_COLLECTIVE(device.is_cuda(), "--conv-statistics on needs GPUs");
    MYRIAD_CHECK_COLLECTIVE(half,
                            "--conv-statistics on needs --precision bf16 or fp16 (the sums come "
                            "from 16-bit convolutions; this run computes in {})",
                            to_string(r.precision));
    MYRIAD_CHECK_COLLECTIVE(r.channels_last,
                            "--conv-statistics on needs channels-last maps (--channels-last on)");
    MYRIAD_CHECK_COLLECTIVE(convolution_statistics_built(),
                            "--conv-statistics on needs a build with cuDNN's graph API (CMake "
                            "found no cuDNN 9 headers and library: set CUDNN_ROOT)");
  }
  return r.toggle != Toggle::kOff && !r.deterministic && device.is_cuda() && half &&
         r.channels_last && !r.sync_bn && convolution_statistics_built();
}

torch::ScalarType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return torch::kFloat32;
    case Precision::kBf16:
      return torch::kBFloat16;
    case Precision::kFp16:
      return torch::kFloat16;
    case Precision::kAuto:
      break;
  }
  MYRIAD_THROW("--precision {} has no dtype before resolve_precision", to_string(precision));
}

std::optional<torch::ScalarType> autocast_dtype(Precision precision) {
  if (precision == Precision::kFp32) return std::nullopt;
  return compute_dtype(precision);
}

BackboneOptions backbone_options(const TrainConfig& config) {
  BackboneOptions b;
  b.name = config.backbone;
  b.input = config.input;
  b.embedding_size = config.embedding_size;
  b.dropout = config.dropout;
  b.seed = config.seed;
  return b;
}

bool uses_synthetic_data(const TrainConfig& config) {
  return config.data == "synthetic" || config.data == "synthetic-resident";
}

int64_t synthetic_classes(const TrainConfig& config) {
  return config.num_classes > 0 ? config.num_classes : 1000;
}

std::shared_ptr<Backbone> training_backbone(const TrainConfig& config,
                                            const torch::Device& device) {
  std::shared_ptr<Backbone> backbone = make_backbone(backbone_options(config));
  backbone->set_activation_checkpointing(config.activation_checkpointing);
  backbone->set_channels_last(use_channels_last(config.channels_last, device));
  return backbone;
}

bool use_channels_last(Toggle choice, const torch::Device& device) {
  return choice == Toggle::kOn || (choice == Toggle::kAuto && device.is_cuda());
}

int64_t optimizer_states(const TrainConfig& config) {
  return config.optimizer == OptimizerKind::kAdamW ? 2 : 1;
}

double parameter_state_factor(const TrainConfig& config) {
  return 2.0 + static_cast<double>(optimizer_states(config));
}

}  // namespace myriad
