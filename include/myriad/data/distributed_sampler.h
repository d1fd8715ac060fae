#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace myriad {

// Where training stands in the data: the epoch and how many samples of that epoch's permutation
// are consumed. Independent of the number of ranks, so it carries over when a run resumes on a
// different world size.
struct DataPosition {
  int64_t epoch = 0;
  int64_t offset = 0;
};

// Which samples each rank reads at each step. Every epoch is a fresh permutation of the dataset
// from (seed, epoch); global batch t of an epoch is permutation entries [t*G, (t+1)*G), and rank r
// reads its balanced slice of it. Ranks therefore read disjoint samples, and the global batch of
// a step does not depend on the number of ranks. An epoch has floor(N / G) steps: the N mod G
// samples left at the end of a permutation are not read in that epoch (the next permutation
// reshuffles everything, so no sample is systematically skipped).
class DistributedSampler {
 public:
  // N < G is an error: not even one global batch.
  DistributedSampler(int64_t dataset_size, int64_t global_batch, int world_size, uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t dataset_size() const { return size_; }
  // Dataset indices rank `rank` reads for the global batch at `position`.
  std::vector<int64_t> indices(const DataPosition& position, int rank) const;
  // The key of the first sample `rank` reads at `position` (the rest follow in order): its place
  // in the run's stream of samples, unique over the run and the same whatever the number of
  // ranks. It keys per-sample randomness (Activations::keys).
  int64_t first_key(const DataPosition& position, int rank) const;
  // The position `steps` global batches after `start` (a batch never spans two epochs).
  DataPosition advance(const DataPosition& start, int64_t steps) const;

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  int64_t size_;
  int64_t global_batch_;
  int world_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  std::vector<int64_t> offsets_;
  mutable std::mutex mutex_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_;
};

}  // namespace myriad
