#include "myriad/train/training_checkpoint.h"

#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>

#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/class_rows.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/backbone.h"
#include "myriad/train/loss_scaler.h"
#include "myriad/train/optimizer_state.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"
#include "myriad/util/remove_tree.h"

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

void write_rows_in_blocks(Hdf5File& file, const std::string& name, const torch::Tensor& rows) {
  const int64_t block = rows_per_block(rows.numel() / std::max<int64_t>(1, rows.size(0)));
  file.create(name, torch::kFloat32, rows.sizes().vec(),
              std::min<int64_t>(std::max<int64_t>(1, rows.size(0)), 4096));
  for (int64_t begin = 0; begin < rows.size(0); begin += block) {
    const int64_t count = std::min(block, rows.size(0) - begin);
    file.write_rows(name, begin,
                    rows.slice(0, begin, begin + count).to(torch::kCPU, torch::kFloat32));
  }
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

// The backbone optimizer's per-parameter states, by parameter name.
void write_optimizer(Hdf5File& file, bool adamw, const std::vector<NamedParamState>& states) {
  file.set_attribute("/", "backbone_optimizer", std::string(adamw ? "adamw" : "sgd"));
  for (const NamedParamState& state : states) {
    const std::string group = "optimizer_state/" + state.param;
    for (const auto& [name, tensor] : state.tensors) file.write(group + "/" + name, tensor.cpu());
    if (adamw) file.set_attribute(group + "/exp_avg", "step", state.step);
  }
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

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// Writes the files of this rank into `directory`; returns their names.
std::vector<std::string> write_files(const ProcessContext& context, const std::string& directory,
                                     const TrainingState& state) {
  ShardedMarginSoftmax& classifier = *state.classifier;
  const torch::Device device = classifier.device();
  std::vector<std::string> written;
  if (context.rank() == 0) {
    const std::string path = (fs::path(directory) / kReplicatedFile).string();
    {
      Hdf5File file(path, Hdf5File::Mode::kCreate);
      for (const auto& [name, tensor] : state.backbone->state_dict()) {
        file.write(dataset_name("backbone", name), tensor.detach().cpu());
      }
      std::vector<NamedParamState> optimizer_states =
          named_param_states(*state.optimizer, *state.backbone);
      optimizer_states.insert(optimizer_states.end(), state.other_stage_states.begin(),
                              state.other_stage_states.end());
      write_optimizer(file, dynamic_cast<torch::optim::AdamW*>(state.optimizer) != nullptr,
                      optimizer_states);
      file.set_attribute("/", "step", state.step);
      file.set_attribute("/", "epoch", state.position.epoch);
      file.set_attribute("/", "epoch_offset", state.position.offset);
      file.set_attribute("/", "classifier_steps", classifier.steps());
      file.set_attribute("/", "classifier_optimizer_steps", classifier.optimizer().step());
      file.set_attribute("/", "loss_scale", state.scaler != nullptr ? state.scaler->scale() : 1.0);
      file.set_attribute("/", "loss_scale_clean_steps",
                         state.scaler != nullptr ? state.scaler->clean_steps() : 0);
      file.set_attribute("/", "config", state.config);
    }
    written.push_back(kReplicatedFile);
  }
  const std::string shard = shard_file_name(context.rank());
  {
    Hdf5File file((fs::path(directory) / shard).string(), Hdf5File::Mode::kCreate);
    write_rows_in_blocks(file, "weight", classifier.weight());
    for (const auto& [name, tensor] : classifier.optimizer().state())
      write_rows_in_blocks(file, "state/" + name, *tensor);
    file.set_attribute("/", "rank", static_cast<int64_t>(context.rank()));
    file.set_attribute("/", "class_offset", classifier.partition().offset(context.rank()));
    file.set_attribute("/", "rows", classifier.partition().size(context.rank()));
    file.write("rng", rng_state(device));
  }
  written.push_back(shard);
  return written;
}

}  // namespace

StateDict read_backbone_state(const Hdf5File& replicated) {
  StateDict state;
  for (const std::string& name : replicated.list("backbone"))
    state.emplace_back(name, replicated.read(dataset_name("backbone", name)));
  return state;
}

void save_checkpoint(const ProcessContext& context, const CheckpointStore& store,
                     const TrainingState& state, int keep) {
  const auto start = std::chrono::steady_clock::now();
  const std::string temporary = store.temporary_for(state.step);
  const std::string what = str_format("checkpoint at step {}", state.step);
  on_every_rank(context, what, [&] {
    if (context.rank() != 0) return;
    std::error_code error;
    fs::create_directories(store.root(), error);
    MYRIAD_CHECK(!error, "cannot create '{}': {}", store.root(), error.message());
    const std::string stale = remove_tree(temporary);
    MYRIAD_CHECK(stale.empty(), "{}", stale);
    fs::create_directories(temporary, error);
    MYRIAD_CHECK(!error, "cannot create '{}': {}", temporary, error.message());
  });

  nlohmann::json mine;
  double write_seconds = 0, sync_seconds = 0, checksum_seconds = 0;
  int64_t bytes = 0;
  try {
    // Each rank writes, syncs and checksums its own files.
    on_every_rank(context, what, [&] {
      if (const char* fault = std::getenv("MYRIAD_FAULT_SAVE_RANK");
          fault != nullptr && std::atoi(fault) == context.rank()) {
        MYRIAD_THROW("injected failure (MYRIAD_FAULT_SAVE_RANK)");
      }
      auto mark = std::chrono::steady_clock::now();
      const auto lap = [&mark] {
        const auto now = std::chrono::steady_clock::now();
        const double seconds = std::chrono::duration<double>(now - mark).count();
        mark = now;
        return seconds;
      };
      const std::vector<std::string> written = write_files(context, temporary, state);
      write_seconds = lap();
      for (const std::string& name : written) sync_path((fs::path(temporary) / name).string());
      sync_seconds = lap();
      for (const std::string& name : written) {
        const std::string path = (fs::path(temporary) / name).string();
        mine[name] = {{"bytes", static_cast<int64_t>(fs::file_size(path))},
                      {"crc32", crc32_hex(file_crc32(path))}};
      }
      checksum_seconds = lap();
    });
    std::map<std::string, FileEntry> files;
    for (const std::string& part : context.all_gather_strings(mine.dump())) {
      for (const auto& [name, entry] :
           file_entries_from_json(nlohmann::json::parse(part), "a rank's file list")) {
        files[name] = entry;
        bytes += entry.bytes;
      }
    }
    if (const char* fault = std::getenv("MYRIAD_FAULT_ABORT_IN_SAVE");
        fault != nullptr && std::atoi(fault) == 1) {
      // Testing hook: die like a killed job after the shards exist and before anything is
      // published.
      std::abort();
    }

    on_every_rank(context, what, [&] {
      if (context.rank() != 0) return;
      Manifest manifest;
      manifest.step = state.step;
      manifest.position = state.position;
      manifest.world_size = context.size();
      manifest.num_classes = state.classifier->partition().num_classes();
      manifest.embedding_size = state.classifier->options().embedding_size;
      manifest.config = state.config;
      manifest.created = utc_now();
      for (int r = 0; r < context.size(); ++r) {
        manifest.shards.push_back({shard_file_name(r), r, state.classifier->partition().offset(r),
                                   state.classifier->partition().size(r)});
      }
      manifest.files = files;
      write_file_atomically((fs::path(temporary) / kManifestFile).string(),
                            manifest.to_json().dump(2) + "\n");
      sync_path(temporary);
      store.publish(temporary, state.step, keep);
    });
  } catch (const Error&) {
    // A failed save leaves nothing behind. Each phase above ends in an agreement of all ranks, so
    // none writes into the temporary directory any more; the previous checkpoint stays in use.
    if (context.rank() == 0) remove_tree(temporary);
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info(
      "checkpoint at step {} written to {}: {} in {:.1f} s, {:.2f} GB/s (rank 0: write {:.1f} s, "
      "fsync {:.1f} s, checksum {:.1f} s)",
      state.step, store.directory_for(state.step), format_bytes(static_cast<double>(bytes)),
      seconds, bytes / seconds / 1e9, write_seconds, sync_seconds, checksum_seconds);
}

void load_checkpoint(const ProcessContext& context, const std::string& directory,
                     TrainingState& state) {
  const auto start = std::chrono::steady_clock::now();
  ShardedMarginSoftmax& classifier = *state.classifier;
  const ClassPartition& partition = classifier.partition();
  const int64_t first = partition.offset(context.rank());
  const int64_t rows = partition.size(context.rank());
  Manifest manifest;
  on_every_rank<CheckpointInvalid>(
      context, str_format("verifying checkpoint '{}'", directory), [&] {
        manifest = read_manifest(directory);
        // Each rank verifies what it will read: the replicated state and the shards holding its
        // rows.
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
  const torch::Device device = classifier.device();
  const Hdf5File replicated((fs::path(directory) / kReplicatedFile).string(),
                            Hdf5File::Mode::kRead);
  state.backbone->load_state_dict(read_backbone_state(replicated),
                                  str_format("checkpoint '{}'", directory));
  read_optimizer(replicated, *state.optimizer, *state.backbone);
  state.step = manifest.step;
  state.position = manifest.position;
  classifier.set_steps(replicated.int_attribute("/", "classifier_steps").value_or(0));
  classifier.optimizer().set_step(
      replicated.int_attribute("/", "classifier_optimizer_steps").value_or(0));
  if (state.scaler != nullptr) {
    state.scaler->set_scale(
        replicated.float_attribute("/", "loss_scale").value_or(state.scaler->scale()));
    state.scaler->set_clean_steps(
        replicated.int_attribute("/", "loss_scale_clean_steps").value_or(0));
  }

  // This rank's class rows, from whichever old shards hold them.
  std::vector<std::pair<std::string, torch::Tensor*>> targets = {{"weight", &classifier.weight()}};
  for (const auto& [name, tensor] : classifier.optimizer().state()) {
    targets.emplace_back("state/" + name, tensor);
  }
  on_every_rank(context, str_format("loading the classifier from '{}'", directory), [&] {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : targets) {
      read_class_rows(directory, manifest, name, first, first + rows,
                      [&](int64_t at, const torch::Tensor& block) {
                        tensor->slice(0, at, at + block.size(0)).copy_(block);
                      });
    }
  });
  // Random state continues only where the same ranks saved it (a resharded checkpoint has none);
  // otherwise it is reseeded.
  torch::Tensor rng;
  if (manifest.world_size == context.size()) {
    const Hdf5File own((fs::path(directory) / shard_file_name(context.rank())).string(),
                       Hdf5File::Mode::kRead);
    if (own.has("rng")) rng = own.read("rng");
  }
  if (context.all_true(rng.defined())) {
    set_rng_state(device, rng);
  } else {
    log_info(
        "resuming {} ranks from a checkpoint of {}: classifier rows resharded, random state "
        "reseeded",
        context.size(), manifest.world_size);
    torch::manual_seed(static_cast<uint64_t>(state.step) * 1000003u +
                       static_cast<uint64_t>(context.rank()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("resumed from {} (step {}, epoch {}) in {:.1f} s", directory, state.step,
           state.position.epoch, seconds);
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
