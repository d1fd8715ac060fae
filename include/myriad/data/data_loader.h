#pragma once

#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "myriad/data/batch_source.h"
#include "myriad/data/distributed_sampler.h"
#include "myriad/data/image_source.h"

namespace myriad {

struct LoaderOptions {
  DataPosition start;  // where the first batch is (resuming starts later)
  int workers = 4;     // threads reading and decoding
  int prefetch = 4;    // batches prepared ahead of the consumer
  bool random_flip = true;
  uint64_t seed = 0;  // flips are drawn from (seed, epoch, sample)
  int rank = 0;
  bool pin_memory = false;  // page-locked batches, for asynchronous copies to a GPU
};

// Reads this rank's batches in order with a pool of worker threads that read, decode,
// augment (random horizontal flip) and normalise ahead of the consumer. Any worker's error is
// raised by next() for the batch it concerned.
class DataLoader final : public BatchSource {
 public:
  DataLoader(std::shared_ptr<const ImageSource> source,
             std::shared_ptr<const DistributedSampler> sampler, const LoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next() override;
  int64_t steps_per_epoch() const { return sampler_->steps_per_epoch(); }

 private:
  struct Slot {
    Batch batch;
    std::string error;
  };
  void work();
  Slot build(int64_t index) const;

  std::shared_ptr<const ImageSource> source_;
  std::shared_ptr<const DistributedSampler> sampler_;
  LoaderOptions options_;
  std::mutex mutex_;
  std::condition_variable produced_;
  std::condition_variable consumed_;
  std::map<int64_t, Slot> ready_;
  int64_t next_to_build_ = 0;
  int64_t next_to_return_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// One image's float CHW planes, normalised as the loader does, from uint8 HWC pixels; flipped
// left-right when `flip`. Shared with evaluation, which reads without augmentation.
void normalize_image(const uint8_t* hwc, int height, int width, int channels, bool flip,
                     float* chw);

}  // namespace myriad
