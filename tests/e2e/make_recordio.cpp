// Writes an insightface-style RecordIO dataset from real Fashion-MNIST images (Debian's
// dataset-fashion-mnist), each stored as its JPEG bytes, for the myriad-data tests:
//   make_recordio PREFIX COUNT [header|no-header] [odd-size]
// PREFIX.rec and PREFIX.idx hold COUNT images of the test split, sorted by class as insightface
// sorts identities; with `header` (the default) record 0 is the insightface header and one
// identity record per class follows the images. PREFIX-expected.h5 is what a faithful conversion
// holds: the same JPEG bytes and labels in key order. With `odd-size` the sixth image is stored at
// half size. Exits 77 without the dataset.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/idx_file.h"
#include "myriad/data/image_codec.h"
#include "support/recordio_writer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_recordio PREFIX COUNT [header|no-header] [odd-size]\n");
    return 2;
  }
  const std::string prefix = argv[1];
  const int64_t count = std::stoll(argv[2]);
  const bool header = argc < 4 || std::string(argv[3]) != "no-header";
  const bool odd_size = argc > 4 && std::string(argv[4]) == "odd-size";
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  if (!std::filesystem::exists(root + "t10k-images-idx3-ubyte.gz")) {
    std::fprintf(stderr, "SKIP: Fashion-MNIST is not installed (dataset-fashion-mnist)\n");
    return 77;
  }
  const myriad::IdxArray images = myriad::read_idx(root + "t10k-images-idx3-ubyte.gz");
  const myriad::IdxArray labels = myriad::read_idx(root + "t10k-labels-idx1-ubyte.gz");
  const int h = static_cast<int>(images.dims[1]), w = static_cast<int>(images.dims[2]);
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return labels.data[a] < labels.data[b]; });
  const int classes = 1 + *std::max_element(labels.data.begin(), labels.data.begin() + count);

  myriad::testing::RecordIoWriter writer(prefix + ".rec", prefix + ".idx");
  myriad::Hdf5ImageWriter expected(prefix + "-expected.h5", count, h, w, 3, true, classes);
  const int64_t first_key = header ? 1 : 0;
  if (header) {
    const float first_identity = static_cast<float>(count + 1);
    writer.write(0, myriad::testing::pack_image_record({first_identity, first_identity + classes},
                                                       false, 0, ""));
  }
  std::vector<int64_t> class_begin(classes + 1, -1);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = order[k];
    const int label = labels.data[i];
    const uint8_t* pixels = images.data.data() + i * h * w;
    std::string jpeg;
    if (odd_size && k == 5) {
      std::vector<uint8_t> half(static_cast<size_t>(h / 2 * (w / 2)));
      for (int y = 0; y < h / 2; ++y)
        for (int x = 0; x < w / 2; ++x) half[y * (w / 2) + x] = pixels[2 * y * w + 2 * x];
      jpeg = myriad::encode_jpeg(half.data(), h / 2, w / 2, 1, 90);
    } else {
      jpeg = myriad::encode_jpeg(pixels, h, w, 1, 85 + static_cast<int>(k % 10));
    }
    writer.write(first_key + k,
                 myriad::testing::pack_image_record({static_cast<float>(label)}, true,
                                                    static_cast<uint64_t>(i), jpeg));
    expected.write_encoded(k, {jpeg});
    expected.write_labels(k, {label});
    if (class_begin[label] < 0) class_begin[label] = first_key + k;
  }
  if (header) {
    class_begin[classes] = first_key + count;
    for (int c = 0; c < classes; ++c) {
      writer.write(count + 1 + c,
                   myriad::testing::pack_image_record(
                       {static_cast<float>(class_begin[c]), static_cast<float>(class_begin[c + 1])},
                       false, 0, ""));
    }
  }
  expected.finish();
  std::printf("%s.rec: %lld images of %d classes%s\n", prefix.c_str(),
              static_cast<long long>(count), classes, header ? " (insightface header)" : "");
  return 0;
}
