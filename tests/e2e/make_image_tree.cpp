// Writes a class-per-directory tree of small JPEG and PNG files for the myriad-data tests:
//   make_image_tree DIR CLASSES PER_CLASS [corrupt | truncated | faces [FIRST_CLASS]]
// With `corrupt`, the last file of the last class is cut short within its header; with
// `truncated`, only its image data is cut (its header reads: only decoding finds the damage).
// Otherwise DIR.expected.h5 holds what a faithful conversion holds: every file's bytes and its
// class, in sorted path order.
// With `faces`, the directories are identities (person_K, K from FIRST_CLASS, default 0) and their
// images views of prototype classes (data/prototype_dataset.h), the same on any machine, at three
// sizes, JPEG and PNG: images of any size, of learnable identities, as from-folder --resize takes
// them. No expected file then.

#include <array>
#include <filesystem>
#include <string>
#include <vector>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/prototype_dataset.h"
#include "support/test_files.h"

namespace {

std::string encode(const std::vector<uint8_t>& pixels, int h, int w, bool png) {
  return png ? myriad::testing::encode_png(pixels.data(), h, w, 3)
             : myriad::encode_jpeg(pixels.data(), h, w, 3, 90);
}

// The JPEG or PNG cut in half after its header: the first scan's (or image data's) bytes.
std::string cut_data(const std::string& bytes, bool png) {
  const size_t data = png ? bytes.find("IDAT") : bytes.find("\xFF\xDA");
  return bytes.substr(0, data + (bytes.size() - data) / 2);
}

// PER_CLASS views of each of CLASSES prototype identities from FIRST_CLASS on, at three sizes.
void write_faces(const std::filesystem::path& root, int classes, int per_class, int first_class) {
  const std::array<std::array<int, 2>, 3> sizes = {{{120, 100}, {96, 128}, {150, 150}}};
  for (int c = first_class; c < first_class + classes; ++c) {
    const std::filesystem::path dir = root / ("person_" + std::to_string(c));
    std::filesystem::create_directories(dir);
    for (int i = 0; i < per_class; ++i) {
      const auto [h, w] = sizes[(c + i) % sizes.size()];
      myriad::PrototypeOptions options;
      options.num_classes = first_class + classes;
      options.channels = 3;
      options.height = h;
      options.width = w;
      options.noise = 16.0;
      std::vector<uint8_t> pixels(static_cast<size_t>(h) * w * 3);
      myriad::PrototypeDataset(options).render(c, i, pixels.data());
      const bool png = i % 2 == 1;
      myriad::testing::write_bytes(
          (dir / ("face_" + std::to_string(i) + (png ? ".png" : ".jpg"))).string(),
          encode(pixels, h, w, png));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::filesystem::path root = argv[1];
  const int classes = std::stoi(argv[2]), per_class = std::stoi(argv[3]);
  const std::string mode = argc > 4 ? argv[4] : "";
  if (mode == "faces") {
    write_faces(root, classes, per_class, argc > 5 ? std::stoi(argv[5]) : 0);
    return 0;
  }
  const bool damaged = mode == "corrupt" || mode == "truncated";
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
      std::string bytes = encode(pixels, h, w, png);
      if (damaged && c == classes - 1 && i == per_class - 1) {
        bytes = mode == "corrupt" ? bytes.substr(0, bytes.size() / 4) : cut_data(bytes, png);
      }
      myriad::testing::write_bytes(
          (dir / ("img_" + std::to_string(i) + (png ? ".png" : ".jpg"))).string(), bytes);
      files.push_back(bytes);
      labels.push_back(c);
    }
    myriad::testing::write_bytes((dir / "notes.txt").string(), "not an image");
  }
  if (!damaged) {
    myriad::Hdf5ImageWriter expected(root.string() + ".expected.h5",
                                     static_cast<int64_t>(files.size()), h, w, 3, true, classes);
    expected.write_encoded(0, files);
    expected.write_labels(0, labels);
    expected.finish();
  }
  return 0;
}
