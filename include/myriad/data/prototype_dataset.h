#pragma once

#include <cstdint>
#include <vector>

#include "myriad/data/image_source.h"

namespace myriad {

// What `myriad-data synthetic --prototypes` generates. The defaults make a task whose difficulty
// grows with the class count, as it does for faces: at 1x16x16, a nearest-class-mean classifier
// over the raw pixels of 16 views per class gets 93% of held-out views right among 2K classes
// and 57% among 100K, and smallcnn 96% among 10K (docs/data-format.md).
struct PrototypeOptions {
  int64_t num_classes = 0;
  int64_t images_per_class = 16;
  int channels = 1, height = 16, width = 16;
  uint64_t seed = 0;
  // The view of each class's first image: a held-out set starts past the training set's views,
  // so that it shows the same prototypes under noise that training never saw.
  int64_t first_view = 0;
  // Cells per side of a prototype's grid of grey levels (at least 2).
  int cells = 6;
  // Standard deviation of the per-pixel noise, in grey levels.
  double noise = 64.0;
  // Largest shift of a view, in prototype cells.
  double shift = 0.25;
  // Largest brightness offset of a view, in grey levels.
  double brightness = 16.0;
};

// A learnable data set with as many classes as wanted. Class k has a prototype: a grid of
// cells x cells grey levels per channel drawn from hash(seed, k), mirror-symmetric like a face
// (so that a flipped view, the trainer's augmentation and verification's flipped copy, is just
// another view) and bilinearly upsampled to the image: low spatial frequency, which a small CNN
// sees through the noise. Image i is class i / images_per_class, view
// first_view + i mod images_per_class of it: the prototype shifted by a fraction of a cell,
// brightened or darkened, plus per-pixel noise, all drawn from (seed, class, view). Every class
// has exactly images_per_class images; images are generated from their index alone, identically
// on any thread or machine.
class PrototypeDataset final : public ImageSource {
 public:
  explicit PrototypeDataset(const PrototypeOptions& options);

  const DatasetInfo& info() const override { return info_; }
  int64_t label(int64_t index) const override;
  void read(const std::vector<int64_t>& indices, uint8_t* out) const override;

  const PrototypeOptions& options() const { return options_; }
  // The view that image `index` shows of its class.
  int64_t view(int64_t index) const;
  // Writes view `view` (any non-negative number) of class `klass` as uint8 [H, W, C] into `out`.
  void render(int64_t klass, int64_t view, uint8_t* out) const;

 private:
  PrototypeOptions options_;
  DatasetInfo info_;
  uint64_t prototype_stream_, view_stream_;
};

// The images of a verification pairs file (docs/data-format.md) drawn from `prototypes`' classes:
// pair i is images 2i and 2i + 1, views first_view + 2i and first_view + 2i + 1 (so never a view
// of a set whose views end before first_view), of one class when i is even and of two different
// classes when i is odd, which makes each of the 10 consecutive folds half same, half
// different. The classes are drawn from (seed, i); label() is the class an image shows.
class PrototypePairs final : public ImageSource {
 public:
  PrototypePairs(const PrototypeDataset& prototypes, int64_t pairs);

  const DatasetInfo& info() const override { return info_; }
  int64_t label(int64_t index) const override;
  void read(const std::vector<int64_t>& indices, uint8_t* out) const override;

  static bool same(int64_t pair) { return pair % 2 == 0; }
  // /issame of the file: same(i) for every pair.
  std::vector<uint8_t> issame() const;

 private:
  const PrototypeDataset& prototypes_;
  DatasetInfo info_;
  uint64_t stream_;
};

}  // namespace myriad
