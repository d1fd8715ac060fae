#include "myriad/data/distributed_sampler.h"

#include <numeric>

#include "myriad/util/balanced_split.h"
#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t global_batch, int world_size,
                                       uint64_t seed)
    : size_(dataset_size), global_batch_(global_batch), world_(world_size), seed_(seed) {
  MYRIAD_CHECK_COLLECTIVE(global_batch >= world_size && global_batch > 0,
                          "the global batch ({}) must give every one of {} ranks a sample",
                          global_batch, world_size);
  MYRIAD_CHECK_COLLECTIVE(dataset_size >= global_batch,
                          "the dataset has {} samples, fewer than one global batch of {}",
                          dataset_size, global_batch);
  steps_per_epoch_ = dataset_size / global_batch;
  const std::vector<int64_t> counts = balanced_counts(global_batch, world_size);
  offsets_.assign(world_size + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets_.begin() + 1);
}

const std::vector<int64_t>& DistributedSampler::permutation(int64_t epoch) const {
  if (cached_epoch_ == epoch) return cached_;
  cached_.resize(size_);
  std::iota(cached_.begin(), cached_.end(), int64_t{0});
  // Fisher-Yates with a counter-based generator: identical on every rank, in every LibTorch.
  uint64_t state = mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) + 0xD1B54A32D192ED03ull));
  for (int64_t i = size_ - 1; i > 0; --i) {
    state = mix64(state);
    const int64_t j = static_cast<int64_t>(state % static_cast<uint64_t>(i + 1));
    std::swap(cached_[i], cached_[j]);
  }
  cached_epoch_ = epoch;
  return cached_;
}

std::vector<int64_t> DistributedSampler::indices(const DataPosition& position, int rank) const {
  MYRIAD_CHECK(
      position.epoch >= 0 && position.offset >= 0 && position.offset + global_batch_ <= size_,
      "data position (epoch {}, offset {}) leaves no global batch of {} in {} samples",
      position.epoch, position.offset, global_batch_, size_);
  MYRIAD_CHECK(rank >= 0 && rank < world_, "rank {} outside the world of {}", rank, world_);
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<int64_t>& perm = permutation(position.epoch);
  return {perm.begin() + position.offset + offsets_[rank],
          perm.begin() + position.offset + offsets_[rank + 1]};
}

int64_t DistributedSampler::first_key(const DataPosition& position, int rank) const {
  return position.epoch * size_ + position.offset + offsets_.at(rank);
}

DataPosition DistributedSampler::advance(const DataPosition& start, int64_t steps) const {
  // What is left of the start epoch, then whole epochs.
  const int64_t left = (size_ - start.offset) / global_batch_;
  if (steps < left) return {start.epoch, start.offset + steps * global_batch_};
  const int64_t rest = steps - left;
  return {start.epoch + 1 + rest / steps_per_epoch_, (rest % steps_per_epoch_) * global_batch_};
}

}  // namespace myriad
