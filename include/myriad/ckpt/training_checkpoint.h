#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/data/distributed_sampler.h"

namespace myriad {

class Backbone;
class DynamicLossScaler;
class ProcessContext;
class ShardedMarginSoftmax;

// Everything a run needs to continue exactly where it stopped.
struct TrainingState {
  Backbone* backbone = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // the backbone's
  ShardedMarginSoftmax* classifier = nullptr;
  DynamicLossScaler* scaler = nullptr;  // fp16 runs only
  int64_t step = 0;                     // steps done
  DataPosition position;                // of the next batch
  std::string config;                   // effective configuration (INI)
};

// Writes `state` as checkpoint `state.step` of `store` (collective): rank 0 the replicated state,
// every rank its classifier shard and random state, all into a temporary directory that is
// synced, verified on every rank, given a manifest with sizes and checksums, and only then renamed
// into place; LATEST follows, and only the newest `keep` checkpoints stay. If any rank fails, every
// rank raises the same Error and the previous checkpoint stays the one in use.
void save_checkpoint(const ProcessContext& context, const CheckpointStore& store,
                     const TrainingState& state, int keep);

// Restores `state` from checkpoint `directory` (collective). Each rank verifies the files it reads
// and takes its class rows out of whichever old shards hold them, so the world size may differ from
// the one that saved. A checkpoint of another model or classifier size is an Error that says what
// differs.
void load_checkpoint(const ProcessContext& context, const std::string& directory,
                     TrainingState& state);

}  // namespace myriad
