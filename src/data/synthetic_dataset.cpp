#include "myriad/data/synthetic_dataset.h"

#include <cstring>

#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

SyntheticDataset::SyntheticDataset(int64_t size, int64_t num_classes, int channels, int height,
                                   int width, uint64_t seed)
    : seed_(seed) {
  MYRIAD_CHECK(size > 0 && num_classes > 0, "synthetic data needs a positive size and class count");
  MYRIAD_CHECK(channels > 0 && height > 0 && width > 0, "synthetic images need a positive shape");
  info_.name = "synthetic";
  info_.size = size;
  info_.num_classes = num_classes;
  info_.channels = channels;
  info_.height = height;
  info_.width = width;
}

int64_t SyntheticDataset::label(int64_t index) const {
  return static_cast<int64_t>(mix64(seed_ ^ mix64(static_cast<uint64_t>(index))) %
                              static_cast<uint64_t>(info_.num_classes));
}

void SyntheticDataset::read(const std::vector<int64_t>& indices, uint8_t* out) const {
  const int h = info_.height, w = info_.width, c = info_.channels;
  const int64_t image_bytes = static_cast<int64_t>(h) * w * c;
  for (size_t i = 0; i < indices.size(); ++i) {
    MYRIAD_CHECK(indices[i] >= 0 && indices[i] < info_.size,
                 "synthetic image {} is outside [0, {})", indices[i], info_.size);
    const uint64_t klass = static_cast<uint64_t>(label(indices[i]));
    const int offset = static_cast<int>(mix64(seed_ + 7 * static_cast<uint64_t>(indices[i])) % 16);
    uint8_t* image = out + static_cast<int64_t>(i) * image_bytes;
    for (int y = 0; y < h; ++y) {
      uint8_t row[4];
      for (int ch = 0; ch < c && ch < 4; ++ch) {
        const uint64_t v =
            mix64(seed_ ^ (klass * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(y) << 8) ^ ch);
        row[ch] = static_cast<uint8_t>(32 + v % 176 + offset);
      }
      uint8_t* line = image + static_cast<int64_t>(y) * w * c;
      for (int x = 0; x < w; ++x) {
        for (int ch = 0; ch < c; ++ch) line[x * c + ch] = row[ch % 4];
      }
    }
  }
}

}  // namespace myriad
