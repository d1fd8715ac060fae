// myriad-data synthetic: a dataset file of generated images (docs/data-format.md), raw or
// JPEG-encoded, to exercise and benchmark the data pipeline without real data.

#include <algorithm>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/synthetic_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"

namespace myriad {

int run_synthetic(ProcessContext& context, int argc, char** argv) {
  po::options_description options("synthetic options");
  std::string output, shape_text;
  int64_t size = 10000, classes = 100;
  int quality = 0;
  uint64_t seed = 0;
  // clang-format off
  options.add_options()
      ("output", po::value(&output)->required(), "HDF5 file to write")
      ("size", count_option(&size), "images (e.g. 1600K)")
      ("num-classes", count_option(&classes), "classes (e.g. 100K)")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "CxHxW")
      ("jpeg-quality", po::value(&quality)->default_value(0), "store JPEG bytes of this quality (1-100); 0: raw pixels")
      ("seed", po::value(&seed)->default_value(0), "seed");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(
          argc, argv, options, values,
          "usage: myriad-data synthetic --output X.h5 [--size N --num-classes C --jpeg-quality Q]",
          context.rank())) {
    return kExitOk;
  }
  if (size < 1 || classes < 1) throw UsageError("--size and --num-classes must be positive");
  if (quality < 0 || quality > 100)
    throw UsageError("--jpeg-quality must be in 1..100, or 0 for raw pixels");
  const InputShape shape = parse_input_shape(shape_text);
  const int c = static_cast<int>(shape.channels), h = static_cast<int>(shape.height),
            w = static_cast<int>(shape.width);
  const SyntheticDataset source(size, classes, c, h, w, seed);
  Hdf5ImageWriter writer(output, size, h, w, c, quality > 0, classes);
  writer.set_attribute("source", "myriad-data synthetic");
  ProgressBar progress("synthetic", size);
  const int64_t block = 1024, image_bytes = static_cast<int64_t>(h) * w * c;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t begin = 0; begin < size; begin += block) {
    const int64_t count = std::min(block, size - begin);
    std::vector<int64_t> indices(count), labels(count);
    for (int64_t i = 0; i < count; ++i) {
      indices[i] = begin + i;
      labels[i] = source.label(begin + i);
    }
    std::vector<uint8_t> pixels(static_cast<size_t>(count * image_bytes));
    source.read(indices, pixels.data());
    if (quality > 0) {
      std::vector<std::string> encoded(count);
      parallel_for(count, threads, [&](int64_t i) {
        encoded[i] = encode_jpeg(pixels.data() + i * image_bytes, h, w, c, quality);
      });
      writer.write_encoded(begin, encoded);
    } else {
      writer.write_raw(begin, pixels.data(), count);
    }
    writer.write_labels(begin, labels);
    progress.advance(count);
  }
  writer.finish();
  progress.finish();
  log_info("wrote {}: {} images {}x{}x{} ({}), {} classes", output, size, h, w, c,
           quality > 0 ? str_format("JPEG quality {}", quality) : std::string("raw"), classes);
  return kExitOk;
}

}  // namespace myriad
