// myriad-data synthetic: a dataset file of generated images (docs/data-format.md), raw or
// JPEG-encoded, to exercise and benchmark the data pipeline without real data; with
// --prototypes, a learnable set of any number of classes (noisy views of a random prototype per
// class) and a verification pairs file of held-out views, to measure accuracy at scale.

#include <algorithm>
#include <limits>
#include <string>
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

// The command line.
struct SyntheticOptions {
  std::string output, pairs_output;
  int channels = 0, height = 0, width = 0;
  int64_t size = 10000, classes = 100, images_per_class = 16, views_from = 0, pairs = 6000;
  int quality = 0;  // 0: raw pixels
  uint64_t seed = 0;
  bool prototypes = false;
  double noise = PrototypeOptions().noise;
};

// What only --prototypes takes, checked.
void check_prototype_options(const po::variables_map& values, SyntheticOptions& o) {
  if (o.images_per_class < 1) throw UsageError("--images-per-class must be positive");
  if (option_given(values, "size")) {
    // --size is another way to say the images per class; both must agree.
    if (o.size % o.classes != 0) {
      throw UsageError(str_format(
          "--prototypes makes as many images of each class: --size {} is no multiple of the {} "
          "classes",
          o.size, o.classes));
    }
    if (option_given(values, "images-per-class") && o.size / o.classes != o.images_per_class) {
      throw UsageError(str_format("--size {} is not {} classes x --images-per-class {}", o.size,
                                  o.classes, o.images_per_class));
    }
    o.images_per_class = o.size / o.classes;
  }
  if (o.classes > std::numeric_limits<int64_t>::max() / o.images_per_class)
    throw UsageError(
        str_format("{} classes x {} images is too many", o.classes, o.images_per_class));
  if (!(o.noise >= 0 && o.noise < 1e6)) throw UsageError("--noise must be in [0, 1e6) grey levels");
  if (option_given(values, "pairs") && o.pairs_output.empty())
    throw UsageError("--pairs needs --pairs-output");
  if (!o.pairs_output.empty() && o.pairs < 10)
    throw UsageError(
        str_format("--pairs must be at least 10 (10-fold verification), got {}", o.pairs));
  if (!o.pairs_output.empty() && o.classes < 2)
    throw UsageError("verification pairs need --num-classes of at least 2");
  // Views are numbered from --views-from on: the last must be a number.
  constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();
  if (o.views_from > kMaxCount - o.images_per_class) throw UsageError("--views-from is too large");
  if (!o.pairs_output.empty() && o.pairs > (kMaxCount - o.views_from) / 2)
    throw UsageError("--pairs is too large for --views-from");
}

// `argv` into `o`, checked; false where it asked for help only.
bool parse_synthetic_options(const ProcessContext& context, int argc, char** argv,
                             SyntheticOptions& o) {
  po::options_description options("synthetic options");
  std::string shape_text;
  // clang-format off
  options.add_options()
      ("output", po::value(&o.output), "HDF5 file to write")
      ("size", count_option(&o.size), "images (e.g. 1600K); with --prototypes: classes x --images-per-class")
      ("num-classes", count_option(&o.classes), "classes (e.g. 100K)")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "CxHxW")
      ("jpeg-quality", po::value(&o.quality)->default_value(0), "store JPEG bytes of this quality (1-100); 0: raw pixels")
      ("seed", po::value(&o.seed)->default_value(0), "seed")
      ("prototypes", po::bool_switch(&o.prototypes), "learnable at any class count: each class a random prototype, its images noisy views of it")
      ("images-per-class", count_option(&o.images_per_class), "with --prototypes: images (views) of each class")
      ("views-from", count_option(&o.views_from), "with --prototypes: the first view of each class; a held-out set starts at the training set's --images-per-class")
      ("noise", real_option(&o.noise), "with --prototypes: per-pixel noise, standard deviation in grey levels")
      ("pairs-output", po::value(&o.pairs_output), "with --prototypes: a verification pairs file (--eval-pairs) of views from --views-from on")
      ("pairs", count_option(&o.pairs), "pairs in --pairs-output, half of them of one class");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data synthetic --output X.h5 [--size N --num-classes C "
                          "--jpeg-quality Q]\n"
                          "       myriad-data synthetic --prototypes --num-classes C "
                          "--images-per-class N [--views-from K] [--output X.h5] "
                          "[--pairs-output P.h5 --pairs M]",
                          context.rank())) {
    return false;
  }
  if (!o.prototypes) {
    for (const char* name : {"images-per-class", "views-from", "noise", "pairs-output", "pairs"}) {
      if (option_given(values, name)) throw UsageError(str_format("--{} needs --prototypes", name));
    }
    if (o.output.empty()) throw UsageError("the option '--output' is required but missing");
  }
  if (o.output.empty() && o.pairs_output.empty())
    throw UsageError("--prototypes writes --output, --pairs-output or both: give at least one");
  if (!o.output.empty() && o.output == o.pairs_output)
    throw UsageError("--output and --pairs-output must be different files");
  if (o.size < 1 || o.classes < 1) throw UsageError("--size and --num-classes must be positive");
  if (o.quality < 0 || o.quality > 100)
    throw UsageError("--jpeg-quality must be in 1..100, or 0 for raw pixels");
  const InputShape shape = parse_input_shape(shape_text);
  o.channels = static_cast<int>(shape.channels);
  o.height = static_cast<int>(shape.height);
  o.width = static_cast<int>(shape.width);
  if (o.prototypes) check_prototype_options(values, o);
  return true;
}

std::string encoding_name(int quality) {
  return quality > 0 ? str_format("JPEG quality {}", quality) : "raw";
}

void write_synthetic(const SyntheticOptions& o) {
  const int c = o.channels, h = o.height, w = o.width;
  const SyntheticDataset source(o.size, o.classes, c, h, w, o.seed);
  Hdf5ImageWriter writer(o.output, o.size, h, w, c, o.quality > 0, o.classes);
  writer.set_attribute("source", "myriad-data synthetic");
  write_images(source, writer, true, o.quality, "synthetic");
  writer.finish();
  log_info("wrote {}: {} images {}x{}x{} ({}), {} classes", o.output, o.size, h, w, c,
           encoding_name(o.quality), o.classes);
}

void write_prototypes(const SyntheticOptions& o) {
  const int c = o.channels, h = o.height, w = o.width;
  PrototypeOptions p;
  p.num_classes = o.classes;
  p.images_per_class = o.images_per_class;
  p.channels = c;
  p.height = h;
  p.width = w;
  p.seed = o.seed;
  p.first_view = o.views_from;
  p.noise = o.noise;
  const PrototypeDataset source(p);
  const std::string provenance =
      str_format("myriad-data synthetic --prototypes --seed {} --noise {} --views-from {}", o.seed,
                 o.noise, o.views_from);
  if (!o.output.empty()) {
    Hdf5ImageWriter writer(o.output, source.info().size, h, w, c, o.quality > 0, o.classes);
    writer.set_attribute("source",
                         str_format("{} --images-per-class {}", provenance, o.images_per_class));
    write_images(source, writer, true, o.quality, "prototypes");
    writer.finish();
    log_info("wrote {}: {} images {}x{}x{} ({}), {} classes of {} views each (views {}..{})",
             o.output, source.info().size, h, w, c, encoding_name(o.quality), o.classes,
             o.images_per_class, o.views_from, o.views_from + o.images_per_class - 1);
  }
  if (!o.pairs_output.empty()) {
    const PrototypePairs images(source, o.pairs);
    Hdf5ImageWriter writer(o.pairs_output, 2 * o.pairs, h, w, c, o.quality > 0,
                           /*num_classes=*/0);
    writer.set_attribute("source", provenance);
    write_images(images, writer, false, o.quality, "pairs");
    writer.write_issame(images.issame());
    writer.finish();
    log_info("wrote {}: {} pairs ({} of one class) of views {}.. of {} classes", o.pairs_output,
             o.pairs, (o.pairs + 1) / 2, o.views_from, o.classes);
  }
}

}  // namespace

int run_synthetic(ProcessContext& context, int argc, char** argv) {
  SyntheticOptions o;
  if (!parse_synthetic_options(context, argc, argv, o)) return kExitOk;
  if (o.prototypes) {
    write_prototypes(o);
  } else {
    write_synthetic(o);
  }
  return kExitOk;
}

}  // namespace myriad
