// Writes a class-per-directory tree of small JPEG and PNG files for the myriad-data tests:
//   make_image_tree DIR CLASSES PER_CLASS [corrupt]
// With `corrupt`, the last file of the last class is cut short. Otherwise DIR.expected.h5 holds
// what a faithful conversion holds: every file's bytes and its class, in sorted path order.

#include <filesystem>
#include <string>
#include <vector>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "support/test_files.h"

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::filesystem::path root = argv[1];
  const int classes = std::stoi(argv[2]), per_class = std::stoi(argv[3]);
  const bool corrupt = argc > 4 && std::string(argv[4]) == "corrupt";
  const int h = 16, w = 12;
  std::vector<std::string> files;
  std::vector<int64_t> labels;
  for (int c = 0; c < classes; ++c) {
    const std::filesystem::path dir = root / ("class_" + std::to_string(c));
    std::filesystem::create_directories(dir);
    for (int i = 0; i < per_class; ++i) {
      std::vector<uint8_t> pixels(h * w * 3);
      for (size_t k = 0; k < pixels.size(); ++k)
        pixels[k] = static_cast<uint8_t>((k * 13 + c * 61 + i * 7) % 256);
      const bool png = i % 2 == 1;
      std::string bytes = png ? myriad::testing::encode_png(pixels.data(), h, w, 3)
                              : myriad::encode_jpeg(pixels.data(), h, w, 3, 90);
      if (corrupt && c == classes - 1 && i == per_class - 1)
        bytes = bytes.substr(0, bytes.size() / 4);
      myriad::testing::write_bytes(
          (dir / ("img_" + std::to_string(i) + (png ? ".png" : ".jpg"))).string(), bytes);
      files.push_back(bytes);
      labels.push_back(c);
    }
    myriad::testing::write_bytes((dir / "notes.txt").string(), "not an image");
  }
  if (!corrupt) {
    myriad::Hdf5ImageWriter expected(root.string() + ".expected.h5",
                                     static_cast<int64_t>(files.size()), h, w, 3, true, classes);
    expected.write_encoded(0, files);
    expected.write_labels(0, labels);
    expected.finish();
  }
  return 0;
}
