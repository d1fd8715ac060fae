// Landmarks files (myriad-data from-folder --landmarks): lines, fields, numbers, duplicates.

#include <cmath>
#include <unordered_set>

#include "fuzz_input.h"
#include "myriad/data/landmarks_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string path = fuzz::scratch_directory() + "/landmarks.txt";
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean([&] {
    // What from-folder relies on once a file is accepted: finite points that align, each image
    // once, lines in order.
    std::unordered_set<std::string> seen;
    int64_t line = 0;
    for (const FaceLandmarks& face : read_landmarks_file(path)) {
      if (face.line <= line || face.path.empty() || !seen.insert(face.path).second)
        __builtin_trap();
      line = face.line;
      for (const Point& p : face.points) {
        if (!std::isfinite(p.x) || !std::isfinite(p.y)) __builtin_trap();
      }
      alignment_transform(face.points).inverse();
    }
  });
  return 0;
}
