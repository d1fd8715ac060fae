#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "myriad/data/image_geometry.h"

namespace myriad {

// One line of a landmarks file (myriad-data from-folder --landmarks): an image and where its five
// landmarks lie, in the order of kArcFaceTemplate.
struct FaceLandmarks {
  std::string path;  // as written, lexically normalised ("alice/001.jpg")
  std::array<Point, 5> points;
  int64_t line = 0;  // 1-based, for messages
};

// Every line of `file`: `PATH x1 y1 x2 y2 x3 y3 x4 y4 x5 y5`, separated by spaces or tabs (so
// PATH has none); blank lines are skipped. A line with another count of numbers, a coordinate
// that is not a finite number, points that give no alignment (all on one spot), or a PATH given
// twice is an Error naming FILE:LINE.
std::vector<FaceLandmarks> read_landmarks_file(const std::string& file);

}  // namespace myriad
