#include "myriad/data/landmarks_file.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <unordered_map>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"

namespace myriad {

namespace {

// The fields of `line`, split at spaces, tabs and a trailing carriage return.
std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    at = line.find_first_not_of(" \t\r", at);
    if (at == std::string_view::npos) return out;
    const size_t end = std::min(line.find_first_of(" \t\r", at), line.size());
    out.push_back(line.substr(at, end - at));
    at = end;
  }
}

// `text` as a finite number; `where` names it in the error.
double coordinate(std::string_view text, const std::string& where) {
  const std::string copy(text);
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  MYRIAD_CHECK(end == copy.c_str() + copy.size() && std::isfinite(v),
               "{}: '{}' is not a finite coordinate", where, copy);
  return v;
}

FaceLandmarks parse_line(std::string_view line, int64_t number, const std::string& file) {
  const std::vector<std::string_view> parts = fields(line);
  const std::string where = str_format("{}:{}", file, number);
  MYRIAD_CHECK(parts.size() == 11,
               "{}: {} numbers after the image, 10 expected (PATH x1 y1 ... x5 y5, the left eye, "
               "right eye, nose, left and right mouth corners)",
               where, parts.size() - 1);
  FaceLandmarks face;
  face.path = std::filesystem::path(std::string(parts[0])).lexically_normal().generic_string();
  face.line = number;
  for (int k = 0; k < 5; ++k) {
    face.points[k] = {coordinate(parts[1 + 2 * k], where), coordinate(parts[2 + 2 * k], where)};
  }
  try {
    alignment_transform(face.points).inverse();
  } catch (const Error& e) {
    MYRIAD_THROW("{}: the landmarks of '{}' give no alignment: {}", where, face.path, e.message());
  }
  return face;
}

}  // namespace

std::vector<FaceLandmarks> read_landmarks_file(const std::string& file) {
  const std::string text = read_whole_file(file);
  std::vector<FaceLandmarks> faces;
  std::unordered_map<std::string, int64_t> first_line;
  int64_t number = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    faces.push_back(parse_line(line, number, file));
    const auto [it, fresh] = first_line.emplace(faces.back().path, number);
    MYRIAD_CHECK(fresh, "{}:{}: '{}' has landmarks already on line {}", file, number,
                 faces.back().path, it->second);
  }
  return faces;
}

}  // namespace myriad
