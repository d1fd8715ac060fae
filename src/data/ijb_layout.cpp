#include "myriad/data/ijb_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/text_fields.h"

namespace myriad {

namespace {

// The landmarks file's fields: the image, five points and the score.
constexpr size_t kLandmarkFields = 12;

void check_field_count(const TextFields& fields, size_t expected, const char* layout,
                       const TextLine& at) {
  MYRIAD_CHECK(fields.count == expected, "'{}' line {}: expected {} fields ({}), found {}", at.file,
               at.number, expected, layout, fields.count);
}

void check_exists(const std::string& path, bool directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  const bool found = directory ? fs::is_directory(status) : fs::is_regular_file(status);
  MYRIAD_CHECK(
      found,
      "'{}' {}: from-ijb reads insightface's IJB layout (ROOT/meta/ and "
      "ROOT/loose_crop/, docs/data-format.md)",
      path,
      fs::exists(status) ? (directory ? "is not a directory" : "is not a file") : "does not exist");
}

// The two files must list the same images, line for line.
void check_same_images(const IjbFaces& faces, const IjbLandmarks& landmarks,
                       const IjbLayout& layout) {
  MYRIAD_CHECK(faces.images.size() == landmarks.images.size(),
               "'{}' lists {} images but '{}' lists {}: both must list the same images in the "
               "same order",
               layout.faces, faces.images.size(), layout.landmarks, landmarks.images.size());
  for (size_t i = 0; i < faces.images.size(); ++i) {
    MYRIAD_CHECK(faces.images[i] == landmarks.images[i],
                 "'{}' line {} names image '{}' where '{}' line {} names '{}': both must list "
                 "the same images in the same order",
                 layout.landmarks, landmarks.lines[i], shown_field(landmarks.images[i]),
                 layout.faces, faces.lines[i], shown_field(faces.images[i]));
  }
}

}  // namespace

IjbTarget parse_ijb_target(const std::string& text) {
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "IJBC") return IjbTarget::kIjbc;
  if (upper == "IJBB") return IjbTarget::kIjbb;
  throw UsageError(str_format("--target must be IJBC or IJBB, got '{}'", text));
}

std::string ijb_target_name(IjbTarget target) {
  return target == IjbTarget::kIjbc ? "IJBC" : "IJBB";
}

IjbLayout ijb_layout(const std::string& root, IjbTarget target) {
  const std::string meta = root + "/meta/" + (target == IjbTarget::kIjbc ? "ijbc" : "ijbb");
  return {meta + "_face_tid_mid.txt", meta + "_template_pair_label.txt",
          meta + "_name_5pts_score.txt", root + "/loose_crop"};
}

IjbFaces parse_ijb_faces(std::string_view text, const std::string& file) {
  IjbFaces faces;
  for_each_line(text, [&](int64_t number, const TextFields& fields) {
    const TextLine at{file, number};
    check_field_count(fields, 3, "IMAGE TEMPLATE MEDIA", at);
    faces.images.emplace_back(fields.at[0]);
    faces.templates.push_back(parse_integer_field(fields.at[1], "template id", at));
    faces.medias.push_back(parse_integer_field(fields.at[2], "media id", at));
    faces.lines.push_back(number);
  });
  return faces;
}

IjbLandmarks parse_ijb_landmarks(std::string_view text, const std::string& file) {
  IjbLandmarks landmarks;
  for_each_line(text, [&](int64_t number, const TextFields& fields) {
    const TextLine at{file, number};
    check_field_count(fields, kLandmarkFields, "IMAGE x1 y1 x2 y2 x3 y3 x4 y4 x5 y5 SCORE", at);
    static constexpr const char* kNames[] = {
        "coordinate x1", "coordinate y1", "coordinate x2", "coordinate y2", "coordinate x3",
        "coordinate y3", "coordinate x4", "coordinate y4", "coordinate x5", "coordinate y5"};
    std::array<Point, 5> points;
    for (size_t k = 0; k < points.size(); ++k) {
      points[k].x = parse_finite_field(fields.at[1 + 2 * k], kNames[2 * k], at);
      points[k].y = parse_finite_field(fields.at[2 + 2 * k], kNames[2 * k + 1], at);
    }
    landmarks.images.emplace_back(fields.at[0]);
    landmarks.points.push_back(points);
    landmarks.scores.push_back(
        static_cast<float>(parse_finite_field(fields.at[11], "the detector score", at)));
    landmarks.lines.push_back(number);
  });
  return landmarks;
}

IjbPairs parse_ijb_pairs(std::string_view text, const std::string& file,
                         const std::unordered_set<int64_t>& templates_with_images) {
  IjbPairs pairs;
  const size_t lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  pairs.templates.reserve(2 * lines);
  pairs.labels.reserve(lines);
  for_each_line(text, [&](int64_t number, const TextFields& fields) {
    const TextLine at{file, number};
    check_field_count(fields, 3, "TEMPLATE1 TEMPLATE2 LABEL", at);
    for (size_t k = 0; k < 2; ++k) {
      const int64_t id = parse_integer_field(fields.at[k], "template id", at);
      MYRIAD_CHECK(templates_with_images.count(id) > 0,
                   "'{}' line {}: template {} has no image in the face/template file", file, number,
                   id);
      pairs.templates.push_back(id);
    }
    const std::string_view label = fields.at[2];
    MYRIAD_CHECK(label == "0" || label == "1", "'{}' line {}: pair label '{}' is not 0 or 1", file,
                 number, shown_field(label));
    pairs.labels.push_back(label == "1" ? 1 : 0);
  });
  return pairs;
}

IjbMeta read_ijb_meta(const IjbLayout& layout) {
  for (const std::string* file : {&layout.faces, &layout.landmarks, &layout.pairs})
    check_exists(*file, /*directory=*/false);
  check_exists(layout.loose_crop, /*directory=*/true);
  IjbMeta meta;
  meta.faces = parse_ijb_faces(read_whole_file(layout.faces), layout.faces);
  MYRIAD_CHECK(!meta.faces.images.empty(), "'{}' lists no images", layout.faces);
  meta.landmarks = parse_ijb_landmarks(read_whole_file(layout.landmarks), layout.landmarks);
  check_same_images(meta.faces, meta.landmarks, layout);
  const std::unordered_set<int64_t> templates(meta.faces.templates.begin(),
                                              meta.faces.templates.end());
  meta.pairs = parse_ijb_pairs(read_whole_file(layout.pairs), layout.pairs, templates);
  MYRIAD_CHECK(!meta.pairs.labels.empty(), "'{}' lists no template pairs", layout.pairs);
  return meta;
}

}  // namespace myriad
