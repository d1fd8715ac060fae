#pragma once

#include <torch/types.h>

#include <cstdint>

namespace myriad {

// Partial FC's choice of class rows for one step on one shard. Every class that is a target in
// the global batch is kept; every other class is kept with probability `rate`, decided by a hash
// of (seed, step, global class id). The choice therefore depends on neither the number of ranks
// nor the device, and a run repeats exactly for a given seed.
//
// `local_targets` [B] holds each sample's row in this shard, or -1 when another shard owns it.
// Returns the sorted shard rows to use (int64, on the targets' device).
torch::Tensor sample_class_rows(const torch::Tensor& local_targets, int64_t shard_rows,
                                int64_t class_offset, double rate, uint64_t seed, int64_t step);

}  // namespace myriad
