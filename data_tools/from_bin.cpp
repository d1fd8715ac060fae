// myriad-data from-bin: an insightface verification set (lfw.bin, cfp_fp.bin, agedb_30.bin, ...)
// into an HDF5 pairs file (docs/data-format.md) that myriad-train --eval-pairs reads. The image
// bytes are kept as they are.

#include <algorithm>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/verification_bin.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"

namespace myriad {

int run_from_bin(ProcessContext& context, int argc, char** argv) {
  po::options_description options("from-bin options");
  std::string input, output;
  int channels = 3;
  // clang-format off
  options.add_options()
      ("input", po::value(&input)->required(), "insightface .bin verification set")
      ("output", po::value(&output)->required(), "HDF5 pairs file to write")
      ("channels", po::value(&channels)->default_value(channels), "channels the images decode to: 3 (RGB) or 1");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data from-bin --input lfw.bin --output lfw.h5",
                          context.rank())) {
    return kExitOk;
  }
  if (channels != 1 && channels != 3) throw UsageError("--channels must be 1 or 3");
  const VerificationBin bin = read_verification_bin(input);
  const int64_t n = static_cast<int64_t>(bin.images.size());
  std::vector<ImageShape> shapes(static_cast<size_t>(n));
  parallel_for(
      n, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), [&](int64_t i) {
        shapes[i] = decode_image_header(bin.images[i], str_format("image {} of '{}'", i, input));
      });
  for (int64_t i = 0; i < n; ++i) {
    MYRIAD_CHECK(shapes[i].height == shapes[0].height && shapes[i].width == shapes[0].width,
                 "image {} of '{}' is {}x{} but image 0 is {}x{}; a set must have one size", i,
                 input, shapes[i].height, shapes[i].width, shapes[0].height, shapes[0].width);
  }
  Hdf5ImageWriter writer(output, n, shapes[0].height, shapes[0].width, channels, /*encoded=*/true,
                         /*num_classes=*/0);
  writer.write_encoded(0, bin.images);
  writer.write_issame(bin.issame);
  writer.set_attribute("source", input);
  writer.finish();
  const auto same = std::count(bin.issame.begin(), bin.issame.end(), 1);
  log_info("wrote {}: {} pairs ({} same, {} different) of {}x{} images", output, bin.issame.size(),
           same, bin.issame.size() - same, shapes[0].height, shapes[0].width);
  return kExitOk;
}

}  // namespace myriad
