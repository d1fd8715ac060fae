#include "myriad/data/landmarks_file.h"

#include <filesystem>
#include <unordered_map>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/text_fields.h"

namespace myriad {

namespace {

FaceLandmarks parse_line(const TextFields& parts, const TextLine& at) {
  MYRIAD_CHECK(parts.count == 11,
               "'{}' line {}: {} numbers after the image, 10 expected (PATH x1 y1 ... x5 y5, the "
               "left eye, right eye, nose, left and right mouth corners)",
               at.file, at.number, parts.count - 1);
  FaceLandmarks face;
  face.path = std::filesystem::path(std::string(parts.at[0])).lexically_normal().generic_string();
  face.line = at.number;
  for (int k = 0; k < 5; ++k) {
    face.points[k] = {parse_finite_field(parts.at[1 + 2 * k], "the coordinate", at),
                      parse_finite_field(parts.at[2 + 2 * k], "the coordinate", at)};
  }
  try {
    alignment_transform(face.points).inverse();
  } catch (const Error& e) {
    MYRIAD_THROW("'{}' line {}: the landmarks of '{}' give no alignment: {}", at.file, at.number,
                 face.path, e.message());
  }
  return face;
}

}  // namespace

std::vector<FaceLandmarks> read_landmarks_file(const std::string& file) {
  const std::string text = read_whole_file(file);
  std::vector<FaceLandmarks> faces;
  std::unordered_map<std::string, int64_t> first_line;
  for_each_line(text, [&](int64_t number, const TextFields& parts) {
    faces.push_back(parse_line(parts, TextLine{file, number}));
    const auto [it, fresh] = first_line.emplace(faces.back().path, number);
    MYRIAD_CHECK(fresh, "'{}' line {}: '{}' has landmarks already on line {}", file, number,
                 faces.back().path, it->second);
  });
  return faces;
}

}  // namespace myriad
