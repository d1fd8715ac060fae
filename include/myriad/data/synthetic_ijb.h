#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "myriad/data/ijb_layout.h"
#include "myriad/data/image_geometry.h"
#include "myriad/data/prototype_dataset.h"

namespace myriad {

// IJB-C's 1:1 protocol: 19,557 genuine and 15,638,932 impostor pairs among 23,124 templates of
// 3,531 subjects.
constexpr double kIjbcGenuineFraction = 19557.0 / (19557.0 + 15638932.0);
constexpr double kIjbcSubjectsPerTemplate = 3531.0 / 23124.0;

// What `myriad-data synthetic-ijb` makes (docs/data-format.md, "Synthetic IJB").
struct SyntheticIjbOptions {
  IjbTarget target = IjbTarget::kIjbc;
  int64_t identities = 0;  // 0: IJB-C's subjects per template, at least 2
  int64_t templates = 60;
  int64_t images = 300;
  int64_t pairs = 2000;
  double genuine_fraction = kIjbcGenuineFraction;
  // Per-pixel noise of the faces, in grey levels (PrototypeOptions::noise).
  double noise = 8.0;
  uint64_t seed = 0;
  int workers = 1;
};

// One loose crop: a face placed by a similarity transform over a smooth, noisy background, and
// what the landmarks file says of it.
struct LooseCrop {
  int height = 0, width = 0;
  std::vector<uint8_t> pixels;  // height x width x 3
  Affine face_to_crop;
  std::array<Point, 5> landmarks;  // kArcFaceTemplate through face_to_crop, plus a little noise
  float score = 0.0f;
};

// Templates by index (0 .. templates - 1); the files name them by template_id().
struct TemplatePair {
  int64_t first = 0, second = 0;
  bool genuine = false;
};

// A synthetic IJB-layout set (ijb_layout), every part of it drawn from the seed and its index, so
// that any thread makes the same bytes. Identity k is class k of a PrototypeDataset of 3x112x112
// faces; template t belongs to identity t mod identities; each template holds one or more
// medias, single photos or videos of several frames (images sharing a media id); image i shows
// view i of its identity. Pairs are genuine (two templates of one identity) or impostor (two
// identities), the genuine ones spread evenly over the pairs file. Bad options are UsageErrors
// naming the option.
class SyntheticIjb {
 public:
  explicit SyntheticIjb(const SyntheticIjbOptions& options);

  const SyntheticIjbOptions& options() const { return options_; }
  int64_t identities() const { return identities_; }
  int64_t genuine_pairs() const { return genuine_; }
  int64_t medias() const { return static_cast<int64_t>(media_ids_.size()); }

  // The files' name of image i, and its template's and media's ids.
  static std::string image_name(int64_t image);
  int64_t template_of(int64_t image) const { return image_template_.at(image); }
  int64_t template_id(int64_t t) const { return template_ids_.at(t); }
  int64_t media_id(int64_t image) const { return media_ids_.at(image_media_.at(image)); }
  int64_t identity_of(int64_t t) const { return t % identities_; }

  // The aligned face image i shows, kAlignedSide x kAlignedSide x 3, into `out`.
  void face(int64_t image, uint8_t* out) const;
  LooseCrop loose_crop(int64_t image) const;
  TemplatePair pair(int64_t index) const;

  // The layout under `root` (which must not exist, or be an empty directory), written under a
  // temporary name on options().workers threads and renamed into place when complete.
  void write(const std::string& root) const;

 private:
  void build_templates();
  void write_faces(const std::string& path) const;
  // The JPEG crops into `directory`, on the workers, then their landmarks file.
  void write_crops(const std::string& directory, const std::string& landmarks_path) const;
  void write_pairs(const std::string& path) const;

  SyntheticIjbOptions options_;
  int64_t identities_ = 0, genuine_ = 0;
  PrototypeDataset faces_;
  std::vector<int64_t> image_template_, image_media_;  // per image: template and media index
  std::vector<int64_t> template_ids_, media_ids_;
};

}  // namespace myriad
