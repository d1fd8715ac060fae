#include "myriad/train/training_checkpoint.h"

#include <chrono>
#include <filesystem>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>

#include "myriad/ckpt/class_rows.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/backbone.h"
#include "myriad/optim/loss_scaler.h"
#include "myriad/optim/optimizer_state.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace myriad {

namespace fs = std::filesystem;

namespace {

std::string dataset_name(const std::string& group, const std::string& name) {
  return group + "/" + name;
}

torch::Tensor rng_state(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef MYRIAD_WITH_CUDA
    auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
#endif
  }
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(const torch::Device& device, const torch::Tensor& state) {
  if (device.is_cuda()) {
#ifdef MYRIAD_WITH_CUDA
    auto generator = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
    return;
#endif
  }
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// A parameter's optimizer state as saved, on the parameter's device and in its layout
// (channels-last on GPUs), which the fused optimizer kernels require of parameter, gradient and
// state alike.
torch::Tensor state_like(const Hdf5File& file, const std::string& name, const torch::Tensor& p) {
  const torch::Tensor saved = file.read(name);
  MYRIAD_CHECK_COLLECTIVE(saved.sizes() == p.sizes(),
                          "optimizer state '{}' is {} in the checkpoint, its parameter {} here",
                          name, saved.sizes(), p.sizes());
  return torch::empty_like(p, torch::MemoryFormat::Preserve).copy_(saved);
}

void read_optimizer(const Hdf5File& file, torch::optim::Optimizer& optimizer, Backbone& backbone) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const std::string saved = file.string_attribute("/", "backbone_optimizer").value_or("?");
  MYRIAD_CHECK_COLLECTIVE(saved == (adamw ? "adamw" : "sgd"),
                          "the checkpoint's backbone optimizer is {}, this run's {}", saved,
                          adamw ? "adamw" : "sgd");
  for (const auto& item : backbone.named_parameters()) {
    // A pipeline stage's optimizer holds its own blocks' parameters only.
    if (!optimizer_holds(optimizer, item.value())) continue;
    std::string group = "optimizer_state/" + item.key();
    // A checkpoint from before insightface's names holds the state under the old ones.
    if (!file.has(group) && !backbone.legacy_name(item.key()).empty())
      group = "optimizer_state/" + backbone.legacy_name(item.key());
    const torch::Tensor& p = item.value();
    if (adamw && file.has(group + "/exp_avg")) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->exp_avg(state_like(file, group + "/exp_avg", p));
      s->exp_avg_sq(state_like(file, group + "/exp_avg_sq", p));
      s->step(file.int_attribute(group + "/exp_avg", "step").value_or(0));
      set_param_state(optimizer, p, std::move(s));
    } else if (!adamw && file.has(group + "/momentum_buffer")) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(state_like(file, group + "/momentum_buffer", p));
      set_param_state(optimizer, p, std::move(s));
    }
  }
}

}  // namespace

StateDict read_backbone_state(const Hdf5File& replicated) {
  StateDict state;
  for (const std::string& name : replicated.list("backbone"))
    state.emplace_back(name, replicated.read(dataset_name("backbone", name)));
  return state;
}

std::vector<SnapshotFile> checkpoint_files(const ProcessContext& context,
                                           const TrainingState& state) {
  ShardedMarginSoftmax& classifier = *state.classifier;
  std::vector<SnapshotFile> files;
  if (context.rank() == 0) {
    SnapshotFile replicated;
    replicated.name = kReplicatedFile;
    // Batch norm's statistics change in the next step's forward.
    replicated.changed_by_forward = true;
    for (const auto& [name, tensor] : state.backbone->state_dict())
      replicated.datasets.push_back({dataset_name("backbone", name), tensor});
    std::vector<NamedParamState> optimizer_states =
        named_param_states(*state.optimizer, *state.backbone);
    optimizer_states.insert(optimizer_states.end(), state.other_stage_states.begin(),
                            state.other_stage_states.end());
    const bool adamw = dynamic_cast<torch::optim::AdamW*>(state.optimizer) != nullptr;
    std::vector<std::pair<std::string, int64_t>> adam_steps;
    for (const NamedParamState& s : optimizer_states) {
      const std::string group = "optimizer_state/" + s.param;
      for (const auto& [name, tensor] : s.tensors)
        replicated.datasets.push_back({group + "/" + name, tensor});
      if (adamw) adam_steps.emplace_back(group + "/exp_avg", s.step);
    }
    // Values as they are now: the attributes are written later, by the writer.
    replicated.attributes = [adamw, adam_steps, step = state.step, position = state.position,
                             classifier_steps = classifier.steps(),
                             classifier_optimizer_steps = classifier.optimizer().step(),
                             scale = state.scaler != nullptr ? state.scaler->scale_value() : 1.0,
                             clean = state.scaler != nullptr ? state.scaler->clean_steps() : 0,
                             config = state.config](Hdf5File& file) {
      file.set_attribute("/", "backbone_optimizer", std::string(adamw ? "adamw" : "sgd"));
      for (const auto& [dataset, adam_step] : adam_steps)
        file.set_attribute(dataset, "step", adam_step);
      file.set_attribute("/", "step", step);
      file.set_attribute("/", "epoch", position.epoch);
      file.set_attribute("/", "epoch_offset", position.offset);
      file.set_attribute("/", "classifier_steps", classifier_steps);
      file.set_attribute("/", "classifier_optimizer_steps", classifier_optimizer_steps);
      file.set_attribute("/", "loss_scale", scale);
      file.set_attribute("/", "loss_scale_clean_steps", clean);
      file.set_attribute("/", "config", config);
    };
    files.push_back(std::move(replicated));
  }
  SnapshotFile shard;
  shard.name = shard_file_name(context.rank());
  shard.datasets.push_back({"weight", classifier.weight()});
  for (const auto& [name, tensor] : classifier.optimizer().state())
    shard.datasets.push_back({"state/" + name, *tensor});
  shard.datasets.push_back({"rng", rng_state(classifier.device())});
  shard.attributes = [rank = static_cast<int64_t>(context.rank()),
                      offset = classifier.partition().offset(context.rank()),
                      rows = classifier.partition().size(context.rank())](Hdf5File& file) {
    file.set_attribute("/", "rank", rank);
    file.set_attribute("/", "class_offset", offset);
    file.set_attribute("/", "rows", rows);
  };
  files.push_back(std::move(shard));
  return files;
}

namespace {

// The manifest, once every rank has verified the files it will read (the replicated state and
// the shards holding its rows [first, first + rows)) and that it holds this run's classifier.
Manifest verified_manifest(const ProcessContext& context, const std::string& directory,
                           const ShardedMarginSoftmax& classifier) {
  const ClassPartition& partition = classifier.partition();
  const int64_t first = partition.offset(context.rank());
  const int64_t rows = partition.size(context.rank());
  Manifest manifest;
  on_every_rank<CheckpointInvalid>(
      context, str_format("verifying checkpoint '{}'", directory), [&] {
        manifest = read_manifest(directory);
        std::vector<std::string> needed = {kReplicatedFile};
        for (const ShardEntry& s : manifest.shards) {
          if (s.class_offset < first + rows && first < s.class_offset + s.rows)
            needed.push_back(s.file);
        }
        verify_checkpoint(directory, needed);
      });
  MYRIAD_CHECK_COLLECTIVE(
      manifest.num_classes == partition.num_classes() &&
          manifest.embedding_size == classifier.options().embedding_size,
      "checkpoint '{}' holds a classifier of {} classes x {}, this run has {} x {}", directory,
      manifest.num_classes, manifest.embedding_size, partition.num_classes(),
      classifier.options().embedding_size);
  return manifest;
}

// The backbone, its optimizer, the step counters and the loss scale.
void load_replicated(const std::string& directory, const Manifest& manifest, TrainingState& state) {
  const Hdf5File replicated((fs::path(directory) / kReplicatedFile).string(),
                            Hdf5File::Mode::kRead);
  state.backbone->load_state_dict(read_backbone_state(replicated),
                                  str_format("checkpoint '{}'", directory));
  read_optimizer(replicated, *state.optimizer, *state.backbone);
  state.step = manifest.step;
  state.position = manifest.position;
  ShardedMarginSoftmax& classifier = *state.classifier;
  classifier.set_steps(replicated.int_attribute("/", "classifier_steps").value_or(0));
  classifier.optimizer().set_step(
      replicated.int_attribute("/", "classifier_optimizer_steps").value_or(0));
  if (state.scaler != nullptr) {
    state.scaler->set_state(
        replicated.float_attribute("/", "loss_scale").value_or(state.scaler->scale_value()),
        replicated.int_attribute("/", "loss_scale_clean_steps").value_or(0));
  }
}

// This rank's class rows of the weight and its optimizer state, from whichever old shards hold
// them.
void load_class_rows(const ProcessContext& context, const std::string& directory,
                     const Manifest& manifest, ShardedMarginSoftmax& classifier) {
  const int64_t first = classifier.partition().offset(context.rank());
  const int64_t rows = classifier.partition().size(context.rank());
  std::vector<std::pair<std::string, torch::Tensor*>> targets = {{"weight", &classifier.weight()}};
  for (const auto& [name, tensor] : classifier.optimizer().state()) {
    targets.emplace_back("state/" + name, tensor);
  }
  const bool pinned = classifier.device().is_cuda();
  on_every_rank(context, str_format("loading the classifier from '{}'", directory), [&] {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : targets) {
      read_class_rows(
          directory, manifest, name, first, first + rows,
          [&](int64_t at, const torch::Tensor& block) {
            tensor->slice(0, at, at + block.size(0)).copy_(block);
          },
          pinned);
    }
  });
}

// Random state continues only where the same ranks saved it (a resharded checkpoint has none);
// otherwise it is reseeded.
void load_random_state(const ProcessContext& context, const std::string& directory,
                       const Manifest& manifest, const TrainingState& state) {
  torch::Tensor rng;
  if (manifest.world_size == context.size()) {
    const Hdf5File own((fs::path(directory) / shard_file_name(context.rank())).string(),
                       Hdf5File::Mode::kRead);
    if (own.has("rng")) rng = own.read("rng");
  }
  if (context.all_true(rng.defined())) {
    set_rng_state(state.classifier->device(), rng);
    return;
  }
  log_info(
      "resuming {} ranks from a checkpoint of {}: classifier rows resharded, random state "
      "reseeded",
      context.size(), manifest.world_size);
  torch::manual_seed(static_cast<uint64_t>(state.step) * 1000003u +
                     static_cast<uint64_t>(context.rank()));
}

}  // namespace

void load_checkpoint(const ProcessContext& context, const std::string& directory,
                     TrainingState& state) {
  const auto start = std::chrono::steady_clock::now();
  const Manifest manifest = verified_manifest(context, directory, *state.classifier);
  load_replicated(directory, manifest, state);
  load_class_rows(context, directory, manifest, *state.classifier);
  load_random_state(context, directory, manifest, state);
  log_info("resumed from {} (step {}, epoch {}) in {:.1f} s", directory, state.step,
           state.position.epoch, seconds_since(start));
}

std::optional<std::string> resume_training(const ProcessContext& context, const std::string& resume,
                                           const CheckpointStore& store, TrainingState& state) {
  nlohmann::json listed = nlohmann::json::array();
  on_every_rank(context, str_format("--resume {}", resume), [&] {
    if (context.rank() != 0) return;
    store.remove_stale_temporaries();
    listed = resume_candidates(resume, store);
  });
  const nlohmann::json candidates =
      nlohmann::json::parse(context.all_gather_strings(listed.dump())[0]);
  for (const auto& candidate : candidates) {
    const std::string directory = candidate.get<std::string>();
    try {
      load_checkpoint(context, directory, state);
      return directory;
    } catch (const CheckpointInvalid& e) {
      if (resume != "auto") throw;
      log_warn("skipping checkpoint '{}': {}; falling back to the previous one", directory,
               e.message());
    }
  }
  if (resume == "auto") log_info("no usable checkpoint in {}: starting fresh", store.root());
  return std::nullopt;
}

}  // namespace myriad
