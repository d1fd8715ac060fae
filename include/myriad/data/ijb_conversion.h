#pragma once

#include <cstdint>
#include <string>

#include "myriad/data/ijb_layout.h"

namespace myriad {

// The IJB evaluation file (docs/data-format.md, "The IJB evaluation file"): /images uint8
// [N, 112, 112, 3] (aligned faces, an unlabelled myriad image file), /templates and /medias int64
// [N], /scores float32 [N], /pairs int64 [P, 2], /pair_labels uint8 [P], and the root attributes
// ijb_target, alignment and source.
constexpr const char* kIjbAlignment = "arcface-112";

struct IjbConversion {
  std::string root;  // insightface's layout (ijb_layout)
  IjbTarget target = IjbTarget::kIjbc;
  std::string output;
  int workers = 1;
};

struct IjbConversionSummary {
  int64_t images = 0, templates = 0, pairs = 0, genuine = 0;
  double meta_seconds = 0.0;   // reading and checking the meta files
  double align_seconds = 0.0;  // decoding, aligning and writing the images
};

// Reads and checks the meta files, then decodes every loose crop and aligns it to the ArcFace
// template by its landmarks (align_face), on `workers` threads a block of images at a time, the
// HDF5 write of each block overlapping the next one's decoding. The output is written under a
// temporary name and renamed into place when complete. A bad meta file, a missing or undecodable
// image, or degenerate landmarks is an Error naming the file and its line.
IjbConversionSummary convert_ijb(const IjbConversion& conversion);

}  // namespace myriad
