#pragma once

#include <cstdint>

#include "myriad/data/image_source.h"

namespace myriad {

// `--data synthetic`: images generated on the fly from (seed, index), learnable by construction.
// Image i belongs to class hash(seed, i) mod C; its pixels are horizontal stripes whose
// brightness depends on the class (one value per channel and row), shifted by a small per-image
// offset, so that classes are separable but no two images are identical.
class SyntheticDataset final : public ImageSource {
 public:
  SyntheticDataset(int64_t size, int64_t num_classes, int channels, int height, int width,
                   uint64_t seed);

  const DatasetInfo& info() const override { return info_; }
  int64_t label(int64_t index) const override;
  void read(const std::vector<int64_t>& indices, uint8_t* out) const override;

 private:
  DatasetInfo info_;
  uint64_t seed_;
};

}  // namespace myriad
