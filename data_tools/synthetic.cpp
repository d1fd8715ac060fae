// myriad-data synthetic: a dataset file of generated images (docs/data-format.md), raw or
// JPEG-encoded, to exercise and benchmark the data pipeline without real data; with
// --prototypes, a learnable set of any number of classes (noisy views of a random prototype per
// class) and a verification pairs file of held-out views, to measure accuracy at scale.

#include <algorithm>
#include <limits>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/prototype_dataset.h"
#include "myriad/data/synthetic_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

// Writes every image of `source` into `writer`, with its label when `labelled`, in blocks whose
// images are generated on all cores (prototype images cost a hash per pixel).
void write_images(const ImageSource& source, Hdf5ImageWriter& writer, bool labelled, int quality,
                  const std::string& what) {
  const DatasetInfo& info = source.info();
  const int h = info.height, w = info.width, c = info.channels;
  const int64_t size = info.size, block = 4096, image_bytes = static_cast<int64_t>(h) * w * c;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ProgressBar progress(what, size);
  for (int64_t begin = 0; begin < size; begin += block) {
    const int64_t count = std::min(block, size - begin);
    std::vector<int64_t> labels(count);
    std::vector<uint8_t> pixels(static_cast<size_t>(count * image_bytes));
    std::vector<std::string> encoded(quality > 0 ? count : 0);
    parallel_for(count, threads, [&](int64_t i) {
      uint8_t* image = pixels.data() + i * image_bytes;
      source.read({begin + i}, image);
      if (labelled) labels[i] = source.label(begin + i);
      if (quality > 0) encoded[i] = encode_jpeg(image, h, w, c, quality);
    });
    if (quality > 0) {
      writer.write_encoded(begin, encoded);
    } else {
      writer.write_raw(begin, pixels.data(), count);
    }
    if (labelled) writer.write_labels(begin, labels);
    progress.advance(count);
  }
  progress.finish();
}

}  // namespace

int run_synthetic(ProcessContext& context, int argc, char** argv) {
  po::options_description options("synthetic options");
  std::string output, shape_text, pairs_output;
  int64_t size = 10000, classes = 100, images_per_class = 16, views_from = 0, pairs = 6000;
  int quality = 0;
  uint64_t seed = 0;
  bool prototypes = false;
  double noise = PrototypeOptions().noise;
  // clang-format off
  options.add_options()
      ("output", po::value(&output), "HDF5 file to write")
      ("size", count_option(&size), "images (e.g. 1600K); with --prototypes: classes x --images-per-class")
      ("num-classes", count_option(&classes), "classes (e.g. 100K)")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "CxHxW")
      ("jpeg-quality", po::value(&quality)->default_value(0), "store JPEG bytes of this quality (1-100); 0: raw pixels")
      ("seed", po::value(&seed)->default_value(0), "seed")
      ("prototypes", po::bool_switch(&prototypes), "learnable at any class count: each class a random prototype, its images noisy views of it")
      ("images-per-class", count_option(&images_per_class), "with --prototypes: images (views) of each class")
      ("views-from", count_option(&views_from), "with --prototypes: the first view of each class; a held-out set starts at the training set's --images-per-class")
      ("noise", real_option(&noise), "with --prototypes: per-pixel noise, standard deviation in grey levels")
      ("pairs-output", po::value(&pairs_output), "with --prototypes: a verification pairs file (--eval-pairs) of views from --views-from on")
      ("pairs", count_option(&pairs), "pairs in --pairs-output, half of them of one class");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data synthetic --output X.h5 [--size N --num-classes C "
                          "--jpeg-quality Q]\n"
                          "       myriad-data synthetic --prototypes --num-classes C "
                          "--images-per-class N [--views-from K] [--output X.h5] "
                          "[--pairs-output P.h5 --pairs M]",
                          context.rank())) {
    return kExitOk;
  }
  auto given = [&](const char* name) { return values.count(name) && !values[name].defaulted(); };
  if (!prototypes) {
    for (const char* name : {"images-per-class", "views-from", "noise", "pairs-output", "pairs"}) {
      if (given(name)) throw UsageError(str_format("--{} needs --prototypes", name));
    }
    if (output.empty()) throw UsageError("the option '--output' is required but missing");
  }
  if (output.empty() && pairs_output.empty())
    throw UsageError("--prototypes writes --output, --pairs-output or both: give at least one");
  if (!output.empty() && output == pairs_output)
    throw UsageError("--output and --pairs-output must be different files");
  if (size < 1 || classes < 1) throw UsageError("--size and --num-classes must be positive");
  if (quality < 0 || quality > 100)
    throw UsageError("--jpeg-quality must be in 1..100, or 0 for raw pixels");
  const InputShape shape = parse_input_shape(shape_text);
  const int c = static_cast<int>(shape.channels), h = static_cast<int>(shape.height),
            w = static_cast<int>(shape.width);
  const std::string encoding = quality > 0 ? str_format("JPEG quality {}", quality) : "raw";

  if (!prototypes) {
    const SyntheticDataset source(size, classes, c, h, w, seed);
    Hdf5ImageWriter writer(output, size, h, w, c, quality > 0, classes);
    writer.set_attribute("source", "myriad-data synthetic");
    write_images(source, writer, true, quality, "synthetic");
    writer.finish();
    log_info("wrote {}: {} images {}x{}x{} ({}), {} classes", output, size, h, w, c, encoding,
             classes);
    return kExitOk;
  }

  if (images_per_class < 1) throw UsageError("--images-per-class must be positive");
  if (given("size")) {
    // --size is another way to say the images per class; both must agree.
    if (size % classes != 0) {
      throw UsageError(str_format(
          "--prototypes makes as many images of each class: --size {} is no multiple of the {} "
          "classes",
          size, classes));
    }
    if (given("images-per-class") && size / classes != images_per_class) {
      throw UsageError(str_format("--size {} is not {} classes x --images-per-class {}", size,
                                  classes, images_per_class));
    }
    images_per_class = size / classes;
  }
  if (classes > std::numeric_limits<int64_t>::max() / images_per_class)
    throw UsageError(str_format("{} classes x {} images is too many", classes, images_per_class));
  if (!(noise >= 0 && noise < 1e6)) throw UsageError("--noise must be in [0, 1e6) grey levels");
  if (given("pairs") && pairs_output.empty()) throw UsageError("--pairs needs --pairs-output");
  if (!pairs_output.empty() && pairs < 10)
    throw UsageError(
        str_format("--pairs must be at least 10 (10-fold verification), got {}", pairs));
  if (!pairs_output.empty() && classes < 2)
    throw UsageError("verification pairs need --num-classes of at least 2");
  // Views are numbered from --views-from on: the last must be a number.
  constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();
  if (views_from > kMaxCount - images_per_class) throw UsageError("--views-from is too large");
  if (!pairs_output.empty() && pairs > (kMaxCount - views_from) / 2)
    throw UsageError("--pairs is too large for --views-from");

  PrototypeOptions o;
  o.num_classes = classes;
  o.images_per_class = images_per_class;
  o.channels = c;
  o.height = h;
  o.width = w;
  o.seed = seed;
  o.first_view = views_from;
  o.noise = noise;
  const PrototypeDataset source(o);
  const std::string provenance =
      str_format("myriad-data synthetic --prototypes --seed {} --noise {} --views-from {}", seed,
                 noise, views_from);
  if (!output.empty()) {
    Hdf5ImageWriter writer(output, source.info().size, h, w, c, quality > 0, classes);
    writer.set_attribute("source",
                         str_format("{} --images-per-class {}", provenance, images_per_class));
    write_images(source, writer, true, quality, "prototypes");
    writer.finish();
    log_info("wrote {}: {} images {}x{}x{} ({}), {} classes of {} views each (views {}..{})",
             output, source.info().size, h, w, c, encoding, classes, images_per_class, views_from,
             views_from + images_per_class - 1);
  }
  if (!pairs_output.empty()) {
    const PrototypePairs images(source, pairs);
    Hdf5ImageWriter writer(pairs_output, 2 * pairs, h, w, c, quality > 0, /*num_classes=*/0);
    writer.set_attribute("source", provenance);
    write_images(images, writer, false, quality, "pairs");
    writer.write_issame(images.issame());
    writer.finish();
    log_info("wrote {}: {} pairs ({} of one class) of views {}.. of {} classes", pairs_output,
             pairs, (pairs + 1) / 2, views_from, classes);
  }
  return kExitOk;
}

}  // namespace myriad
