// myriad-data from-folder: a class-per-directory tree of JPEG/PNG files into an HDF5 dataset.
// By default the bytes are stored as they are (no re-encoding) and every image must have one
// size; with --resize (images of any size) or --landmarks (loose face crops, aligned) every image
// is decoded, resized or aligned, and stored again. Every image's header is checked first.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/image_recoder.h"
#include "myriad/data/landmarks_file.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/file_io.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"
#include "recode_options.h"

namespace myriad {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kBlockImages = 1024;

struct Entry {
  std::string path;      // as opened: under --input
  std::string relative;  // as a landmarks file names it: "alice/001.jpg"
  int64_t label;
};

// The classes (sorted directory names) and their images (sorted paths), in label order.
struct Tree {
  std::vector<std::string> classes;
  std::vector<Entry> entries;
  int64_t skipped = 0;  // files that are not .jpg, .jpeg or .png
};

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

Tree list_tree(const std::string& input) {
  MYRIAD_CHECK(fs::is_directory(input), "'{}' is not a directory", input);
  Tree tree;
  for (const auto& e : fs::directory_iterator(input)) {
    if (e.is_directory()) tree.classes.push_back(e.path().filename().string());
  }
  std::sort(tree.classes.begin(), tree.classes.end());
  MYRIAD_CHECK(!tree.classes.empty(), "'{}' has no class subdirectories", input);
  for (size_t label = 0; label < tree.classes.size(); ++label) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fs::path(input) / tree.classes[label])) {
      if (!e.is_regular_file()) continue;
      if (is_image_file(e.path())) {
        files.push_back(e.path());
      } else {
        ++tree.skipped;
      }
    }
    if (files.empty()) log_warn("class '{}' has no images", tree.classes[label]);
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      tree.entries.push_back({f.string(),
                              (fs::path(tree.classes[label]) / f.filename()).generic_string(),
                              static_cast<int64_t>(label)});
    }
  }
  MYRIAD_CHECK(!tree.entries.empty(), "'{}' holds no .jpg, .jpeg or .png files", input);
  return tree;
}

// The command line.
struct FromFolderOptions {
  std::string input, output, landmarks;
  int workers = 0;
  RecodeOptions recode;  // channels set once the images' headers are read
};

// `argv` into `o`, checked; false where it asked for help only.
bool parse_from_folder_options(const ProcessContext& context, int argc, char** argv,
                               FromFolderOptions& o) {
  po::options_description options("from-folder options");
  RecodeText recode;
  // clang-format off
  options.add_options()
      ("input", po::value(&o.input)->required(), "root directory: one subdirectory per class, holding .jpg/.jpeg/.png files")
      ("output", po::value(&o.output)->required(), "HDF5 file to write")
      ("landmarks", po::value(&o.landmarks), "a file of five landmarks per image ('alice/001.jpg x1 y1 ... x5 y5' per line: eyes, nose, mouth corners): align every face to insightface's ArcFace 112x112 template")
      ("workers", po::value(&o.workers)->default_value(0), "threads reading, checking and converting images (0: all cores)");
  // clang-format on
  add_recode_options(options, recode);
  po::variables_map values;
  if (!parse_command_line(
          argc, argv, options, values,
          "usage: myriad-data from-folder --input DIR --output X.h5 [--resize HxW | "
          "--landmarks FILE] [--encoding jpeg|raw]",
          context.rank())) {
    return false;
  }
  // Grey until a colour image is seen (read_headers).
  o.recode = parse_recode_options(values, recode, !o.landmarks.empty(), 1);
  if (o.workers <= 0)
    o.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return true;
}

// fn(i) for every i in [0, n) on `workers` threads, each call advancing `progress` by one.
template <class Fn>
void parallel_with_progress(int64_t n, int workers, ProgressBar& progress, Fn fn) {
  std::mutex mutex;
  parallel_for(n, workers, [&](int64_t i) {
    fn(i);
    std::lock_guard<std::mutex> lock(mutex);
    progress.advance(1);
  });
}

// The header of every image, read on all cores.
std::vector<ImageShape> read_headers(const std::vector<Entry>& entries, int workers) {
  const int64_t n = static_cast<int64_t>(entries.size());
  std::vector<ImageShape> shapes(static_cast<size_t>(n));
  ProgressBar checking("checking", n);
  parallel_with_progress(n, workers, checking, [&](int64_t i) {
    shapes[i] = decode_image_header(read_whole_file(entries[i].path), "'" + entries[i].path + "'");
  });
  checking.finish();
  return shapes;
}

// Images stored as they are must all have the first one's size.
void check_one_size(const std::vector<Entry>& entries, const std::vector<ImageShape>& shapes) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    MYRIAD_CHECK(shapes[i].height == shapes[0].height && shapes[i].width == shapes[0].width,
                 "'{}' is {}x{} but '{}' is {}x{}; all images of a dataset must have one size (or "
                 "give --resize HxW)",
                 entries[i].path, shapes[i].height, shapes[i].width, entries[0].path,
                 shapes[0].height, shapes[0].width);
  }
}

// The landmarks of every entry, in entry order: every image needs a line, every line an image.
std::vector<std::array<Point, 5>> match_landmarks(const std::vector<Entry>& entries,
                                                  const std::string& file,
                                                  const std::string& input) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < entries.size(); ++i) index.emplace(entries[i].relative, i);
  std::vector<std::array<Point, 5>> points(entries.size());
  std::vector<bool> found(entries.size(), false);
  for (const FaceLandmarks& face : read_landmarks_file(file)) {
    const auto it = index.find(face.path);
    MYRIAD_CHECK(it != index.end(),
                 "'{}' line {}: there is no image '{}' under '{}' (one directory per class of "
                 ".jpg, .jpeg or .png files)",
                 file, face.line, face.path, input);
    points[it->second] = face.points;
    found[it->second] = true;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    MYRIAD_CHECK(found[i], "'{}' has no line in the landmarks file '{}' (every image needs one)",
                 entries[i].path, file);
  }
  return points;
}

// Every image, converted by `recoder` on all cores a block at a time, into `writer`.
void write_images(const Tree& tree, const std::vector<ImageShape>& shapes,
                  const std::vector<std::array<Point, 5>>& landmarks, const ImageRecoder& recoder,
                  int workers, Hdf5ImageWriter& writer) {
  const int64_t n = static_cast<int64_t>(tree.entries.size());
  ProgressBar progress(recoder.decodes() ? "converting" : "writing", n);
  const int64_t block = recoder.block_images(kBlockImages);
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t count = std::min(block, n - begin);
    std::vector<std::string> images(static_cast<size_t>(count));
    std::vector<int64_t> labels(static_cast<size_t>(count));
    parallel_with_progress(count, workers, progress, [&](int64_t i) {
      const Entry& e = tree.entries[begin + i];
      images[i] =
          recoder.recode(read_whole_file(e.path), shapes[begin + i],
                         landmarks.empty() ? nullptr : &landmarks[begin + i], "'" + e.path + "'");
    });
    for (int64_t i = 0; i < count; ++i) labels[i] = tree.entries[begin + i].label;
    recoder.write(writer, begin, images);
    writer.write_labels(begin, labels);
  }
  progress.finish();
}

}  // namespace

int run_from_folder(ProcessContext& context, int argc, char** argv) {
  FromFolderOptions o;
  if (!parse_from_folder_options(context, argc, argv, o)) return kExitOk;
  const auto start = std::chrono::steady_clock::now();
  const Tree tree = list_tree(o.input);
  const int64_t n = static_cast<int64_t>(tree.entries.size());
  log_info("{} images in {} classes under {}{}", n, tree.classes.size(), o.input,
           tree.skipped > 0 ? str_format(" ({} other files ignored)", tree.skipped) : "");
  const std::vector<std::array<Point, 5>> landmarks =
      o.landmarks.empty() ? std::vector<std::array<Point, 5>>()
                          : match_landmarks(tree.entries, o.landmarks, o.input);

  const std::vector<ImageShape> shapes = read_headers(tree.entries, o.workers);
  for (const ImageShape& s : shapes) o.recode.channels = std::max(o.recode.channels, s.channels);
  const ImageRecoder recoder(o.recode);
  if (!recoder.decodes()) check_one_size(tree.entries, shapes);

  const ImageShape stored = recoder.stored_shape(shapes[0]);
  Hdf5ImageWriter writer(o.output, n, stored.height, stored.width, stored.channels,
                         /*encoded=*/!recoder.raw(), static_cast<int64_t>(tree.classes.size()));
  writer.set_attribute("class_names", nlohmann::json(tree.classes).dump());
  writer.set_attribute("source", o.input);
  if (recoder.decodes()) writer.set_attribute("preprocessing", recoder.describe());
  write_images(tree, shapes, landmarks, recoder, o.workers, writer);
  writer.finish();
  log_info("wrote {}: {} images {}x{}x{} ({}), {} classes; {:.0f} images/s", o.output, n,
           stored.height, stored.width, stored.channels, recoder.describe(), tree.classes.size(),
           n / seconds_since(start));
  return kExitOk;
}

}  // namespace myriad
