#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/snapshot_writer.h"
#include "myriad/data/distributed_sampler.h"
#include "myriad/optim/optimizer_state.h"
#include "myriad/util/error.h"
#include "myriad/util/state_dict.h"

namespace myriad {

class Backbone;
class Hdf5File;
class DynamicLossScaler;
class ProcessContext;
class ShardedMarginSoftmax;

// Everything a run needs to continue exactly where it stopped.
struct TrainingState {
  // The whole backbone. With pipeline stages, rank 0 holds every stage's parameters and buffers
  // when it saves (PipelineEngine::gather_for_save), and each rank loads all of them.
  Backbone* backbone = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // the backbone's (a pipeline stage's: its blocks')
  ShardedMarginSoftmax* classifier = nullptr;
  DynamicLossScaler* scaler = nullptr;  // fp16 runs only
  int64_t step = 0;                     // steps done
  DataPosition position;                // of the next batch
  std::string config;                   // effective configuration (INI)
  // The optimizer states of the other pipeline stages' parameters (rank 0, for a save).
  std::vector<NamedParamState> other_stage_states;
};

// The backbone tensors of a checkpoint's replicated.h5, by their names there (names from before
// myriad took insightface's are kept: Backbone::load_state_dict maps them).
StateDict read_backbone_state(const Hdf5File& replicated);

// This rank's files of a checkpoint of `state`: rank 0's replicated.h5 (the backbone, its
// optimizer state, the scaler and the data position), and every rank's shard of class rows with
// its random state (docs/checkpoint-format.md). AsyncCheckpointer writes them.
std::vector<SnapshotFile> checkpoint_files(const ProcessContext& context,
                                           const TrainingState& state);

// A checkpoint that fails verification on some rank (a missing, truncated or corrupt file, a bad
// manifest), raised on every rank before anything was loaded.
class CheckpointInvalid : public Error {
 public:
  using Error::Error;
};

// Restores `state` from checkpoint `directory` (collective). Each rank first verifies the files it
// reads (CheckpointInvalid when any rank finds one bad), then takes its class rows out of whichever
// old shards hold them, so the world size may differ from the one that saved. A checkpoint of
// another model or classifier size is an Error that says what differs.
void load_checkpoint(const ProcessContext& context, const std::string& directory,
                     TrainingState& state);

// What --resume asks for (collective): loads the first of resume_candidates(resume, store) that
// verifies, after removing what unfinished saves left in `store`. With "auto", an invalid
// checkpoint is skipped with a warning and the next one tried; an explicit one must be valid.
// Returns the checkpoint loaded, or nothing (state untouched) when there was none to load.
std::optional<std::string> resume_training(const ProcessContext& context, const std::string& resume,
                                           const CheckpointStore& store, TrainingState& state);

}  // namespace myriad
