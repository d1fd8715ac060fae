#include "myriad/ckpt/class_rows.h"

#include <algorithm>
#include <filesystem>

#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {

namespace {

constexpr int64_t kBlockBytes = int64_t{256} << 20;

}  // namespace

int64_t rows_per_block(int64_t row_elements) {
  return std::max<int64_t>(1, kBlockBytes / 4 / std::max<int64_t>(1, row_elements));
}

void read_class_rows(const std::string& checkpoint, const Manifest& manifest,
                     const std::string& dataset, int64_t begin, int64_t end,
                     const std::function<void(int64_t, const torch::Tensor&)>& write) {
  MYRIAD_CHECK(0 <= begin && begin <= end && end <= manifest.num_classes,
               "classes [{}, {}) are outside the {} of checkpoint '{}'", begin, end,
               manifest.num_classes, checkpoint);
  const int64_t block = rows_per_block(manifest.embedding_size);
  for (const ShardEntry& s : manifest.shards) {
    const int64_t from = std::max(begin, s.class_offset);
    const int64_t to = std::min(end, s.class_offset + s.rows);
    if (from >= to) continue;
    const Hdf5File shard((std::filesystem::path(checkpoint) / s.file).string(),
                         Hdf5File::Mode::kRead);
    MYRIAD_CHECK(shard.has(dataset), "'{}' of '{}' has no {}: saved with another optimizer?",
                 s.file, checkpoint, dataset);
    MYRIAD_CHECK(shard.dtype(dataset) == torch::kFloat32, "'{}' of '{}': {} is {}, not float32",
                 s.file, checkpoint, dataset, c10::toString(shard.dtype(dataset)));
    const std::vector<int64_t> shape = shard.shape(dataset);
    MYRIAD_CHECK(shape == std::vector<int64_t>({s.rows, manifest.embedding_size}),
                 "'{}' of '{}': {} has shape {}, its manifest says [{}, {}]", s.file, checkpoint,
                 dataset, c10::IntArrayRef(shape), s.rows, manifest.embedding_size);
    for (int64_t b = from; b < to; b += block) {
      const int64_t count = std::min(block, to - b);
      write(b - begin, shard.read_rows(dataset, b - s.class_offset, count));
    }
  }
}

}  // namespace myriad
