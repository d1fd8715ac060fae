#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "myriad/data/image_geometry.h"

namespace myriad {

// IJB-B and IJB-C as insightface distributes them (docs/data-format.md, "IJB-B and IJB-C"):
// loose face crops, their template and media ids, five landmarks and a detector score per crop,
// and the 1:1 verification pairs of templates.
enum class IjbTarget { kIjbb, kIjbc };

// "IJBC" or "IJBB" (any case); anything else is a UsageError.
IjbTarget parse_ijb_target(const std::string& text);
// "IJBC" or "IJBB".
std::string ijb_target_name(IjbTarget target);

// The files of the layout under `root`; `ijbb_` instead of `ijbc_` for IJB-B.
struct IjbLayout {
  std::string faces;       // ROOT/meta/ijbc_face_tid_mid.txt: IMAGE TEMPLATE MEDIA per line
  std::string pairs;       // ROOT/meta/ijbc_template_pair_label.txt: TEMPLATE1 TEMPLATE2 LABEL
  std::string landmarks;   // ROOT/meta/ijbc_name_5pts_score.txt: IMAGE x1 y1 ... x5 y5 SCORE
  std::string loose_crop;  // ROOT/loose_crop: the images
};
IjbLayout ijb_layout(const std::string& root, IjbTarget target);

// The lines of the face/template file, in its order (the evaluation's image order).
struct IjbFaces {
  std::vector<std::string> images;
  std::vector<int64_t> templates, medias;
  std::vector<int64_t> lines;  // the line each image is on (blank lines are skipped)
};

// The lines of the landmarks file: the five points of each image in kArcFaceTemplate's order
// (left eye, right eye, nose, left and right mouth corners), in the loose crop's pixels.
struct IjbLandmarks {
  std::vector<std::string> images;
  std::vector<std::array<Point, 5>> points;
  std::vector<float> scores;
  std::vector<int64_t> lines;
};

struct IjbPairs {
  std::vector<int64_t> templates;  // [P, 2], row after row
  std::vector<uint8_t> labels;     // 1: the two templates show one identity
};

// Parsers of the files' text; `file` names the file in errors, which give its line. Fields are
// separated by spaces or tabs; blank lines and '\r' before '\n' are allowed. A line with the
// wrong count of fields, an id that is not an integer, a coordinate or score that is not a
// finite number, or a label other than 0 or 1 is an Error.
IjbFaces parse_ijb_faces(std::string_view text, const std::string& file);
IjbLandmarks parse_ijb_landmarks(std::string_view text, const std::string& file);
// A pair naming a template that is not in `templates_with_images` is an Error too.
IjbPairs parse_ijb_pairs(std::string_view text, const std::string& file,
                         const std::unordered_set<int64_t>& templates_with_images);

// What from-ijb needs, read and checked together.
struct IjbMeta {
  IjbFaces faces;
  IjbLandmarks landmarks;  // one per face, in the same order
  IjbPairs pairs;
};

// Reads the three meta files of `layout`. A missing file or loose_crop directory, a bad line, or
// a landmarks file that lists other images than the face/template file (or in another order) is
// an Error naming the file.
IjbMeta read_ijb_meta(const IjbLayout& layout);

}  // namespace myriad
