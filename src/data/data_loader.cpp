#include "myriad/data/data_loader.h"

#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

void normalize_image(const uint8_t* hwc, int height, int width, int channels, bool flip,
                     float* chw) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = hwc + static_cast<int64_t>(y) * width * channels;
    for (int x = 0; x < width; ++x) {
      const uint8_t* pixel = row + static_cast<int64_t>(flip ? width - 1 - x : x) * channels;
      for (int c = 0; c < channels; ++c) {
        chw[c * plane + static_cast<int64_t>(y) * width + x] = pixel[c] * (1.0f / 127.5f) - 1.0f;
      }
    }
  }
}

DataLoader::DataLoader(std::shared_ptr<const ImageSource> source,
                       std::shared_ptr<const DistributedSampler> sampler,
                       const LoaderOptions& options)
    : source_(std::move(source)), sampler_(std::move(sampler)), options_(options) {
  MYRIAD_CHECK(options.workers > 0 && options.prefetch > 0,
               "the loader needs at least one worker and one batch of prefetch");
  for (int i = 0; i < options.workers; ++i) workers_.emplace_back([this] { work(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  consumed_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void DataLoader::work() {
  while (true) {
    int64_t index = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      consumed_.wait(
          lock, [&] { return stopping_ || next_to_build_ < next_to_return_ + options_.prefetch; });
      if (stopping_) return;
      index = next_to_build_++;
    }
    Slot slot = build(index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(index, std::move(slot));
    }
    produced_.notify_all();
  }
}

DataLoader::Slot DataLoader::build(int64_t index) const {
  Slot slot;
  try {
    const DatasetInfo& info = source_->info();
    const DataPosition position = sampler_->advance(options_.start, index);
    const int64_t epoch = position.epoch;
    const std::vector<int64_t> indices = sampler_->indices(position, options_.rank);
    const int64_t n = static_cast<int64_t>(indices.size());
    const int64_t image_bytes = static_cast<int64_t>(info.height) * info.width * info.channels;
    std::vector<uint8_t> pixels(static_cast<size_t>(n * image_bytes));
    source_->read(indices, pixels.data());
    auto options = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(options_.pin_memory);
    slot.batch.images = torch::empty({n, info.channels, info.height, info.width}, options);
    slot.batch.labels = torch::empty(
        {n}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(options_.pin_memory));
    float* images = slot.batch.images.data_ptr<float>();
    int64_t* labels = slot.batch.labels.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t draw =
          mix64(options_.seed ^ mix64(static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull ^
                                      static_cast<uint64_t>(indices[i])));
      normalize_image(pixels.data() + i * image_bytes, info.height, info.width, info.channels,
                      options_.random_flip && (draw & 1) != 0, images + i * image_bytes);
      labels[i] = source_->label(indices[i]);
    }
    slot.batch.index = index;
    slot.batch.position = position;
    slot.batch.next = sampler_->advance(position, 1);
  } catch (const std::exception& e) {
    slot.error = e.what();
  }
  return slot;
}

Batch DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t index = next_to_return_;
  produced_.wait(lock, [&] { return ready_.count(index) > 0; });
  Slot slot = std::move(ready_.at(index));
  ready_.erase(index);
  ++next_to_return_;
  lock.unlock();
  consumed_.notify_all();
  MYRIAD_CHECK(slot.error.empty(), "data loader, batch {}: {}", index, slot.error);
  return std::move(slot.batch);
}

}  // namespace myriad
