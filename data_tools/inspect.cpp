// myriad-data inspect: what an HDF5 dataset (or verification pairs file) holds, validated.

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/train/evaluation.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

// Whether every encoded image decodes its header at the dataset's size, and the formats found.
void print_encoding(const Hdf5ImageDataset& data, const std::string& path) {
  const DatasetInfo& info = data.info();
  if (!info.encoded) {
    std::printf("encoding   raw uint8 pixels\n");
    return;
  }
  std::map<ImageFormat, int64_t> formats;
  ProgressBar progress("checking images", info.size);
  const int64_t block = 1024;
  for (int64_t begin = 0; begin < info.size; begin += block) {
    const int64_t count = std::min(block, info.size - begin);
    const std::vector<std::string> images = data.file().read_bytes("images", begin, count);
    for (int64_t i = 0; i < count; ++i) {
      const std::string what = str_format("image {} of '{}'", begin + i, path);
      const ImageShape shape = decode_image_header(images[i], what);
      MYRIAD_CHECK(shape.height == info.height && shape.width == info.width,
                   "{} is {}x{}, the dataset's are {}x{}", what, shape.height, shape.width,
                   info.height, info.width);
      ++formats[sniff_image_format(images[i])];
    }
    progress.advance(count);
  }
  progress.finish();
  std::printf("encoding   encoded: %lld JPEG, %lld PNG\n",
              static_cast<long long>(formats[ImageFormat::kJpeg]),
              static_cast<long long>(formats[ImageFormat::kPng]));
}

// Images per class: how many classes have any, their spread, and all of them for small sets.
void print_classes(const Hdf5ImageDataset& data) {
  const DatasetInfo& info = data.info();
  std::vector<int64_t> histogram(static_cast<size_t>(info.num_classes), 0);
  for (int64_t i = 0; i < info.size; ++i) ++histogram[data.label(i)];
  const int64_t present =
      std::count_if(histogram.begin(), histogram.end(), [](int64_t c) { return c > 0; });
  std::printf("classes    %lld (num_classes), %lld with images\n",
              static_cast<long long>(info.num_classes), static_cast<long long>(present));
  std::vector<int64_t> sorted = histogram;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {
    std::printf("per class  min %lld, median %lld, max %lld images\n",
                static_cast<long long>(sorted.front()),
                static_cast<long long>(sorted[sorted.size() / 2]),
                static_cast<long long>(sorted.back()));
  }
  if (info.num_classes <= 32) {
    std::printf("histogram ");
    for (int64_t c = 0; c < info.num_classes; ++c)
      std::printf(" %lld:%lld", static_cast<long long>(c), static_cast<long long>(histogram[c]));
    std::printf("\n");
  }
  std::printf("labels     valid (all in [0, %lld))\n", static_cast<long long>(info.num_classes));
}

}  // namespace

int run_inspect(ProcessContext& context, int argc, char** argv) {
  po::options_description options("inspect options");
  std::string path;
  // clang-format off
  options.add_options()
      ("file", po::value(&path)->required(), "HDF5 dataset or verification pairs file (also the first positional argument)");
  // clang-format on
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values, "usage: myriad-data inspect FILE.h5",
                          context.rank(), &positional)) {
    return kExitOk;
  }
  const bool pairs = Hdf5File(path, Hdf5File::Mode::kRead).has("issame");
  const Hdf5ImageDataset data(path, !pairs);
  const DatasetInfo& info = data.info();
  std::printf("file       %s\n", path.c_str());
  std::printf("images     %lld\n", static_cast<long long>(info.size));
  std::printf("shape      %dx%dx%d (height x width x channels)\n", info.height, info.width,
              info.channels);
  print_encoding(data, path);
  if (pairs) {
    const std::vector<bool> issame = read_pair_labels(path, info.size);
    std::printf("pairs      %zu (%lld same identity)\n", issame.size(),
                static_cast<long long>(std::count(issame.begin(), issame.end(), true)));
  } else {
    print_classes(data);
  }
  return kExitOk;
}

}  // namespace myriad
