// myriad-data from-folder: a class-per-directory tree of JPEG/PNG files into an HDF5 dataset of
// encoded images. The bytes are stored as they are (no re-encoding); every image is checked first.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace fs = std::filesystem;

namespace {

struct Entry {
  std::string path;
  int64_t label;
};

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MYRIAD_CHECK(in, "cannot read '{}'", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int run_from_folder(ProcessContext& context, int argc, char** argv) {
  po::options_description options("from-folder options");
  std::string input, output;
  int workers = 0;
  // clang-format off
  options.add_options()
      ("input", po::value(&input)->required(), "root directory: one subdirectory per class, holding .jpg/.jpeg/.png files")
      ("output", po::value(&output)->required(), "HDF5 file to write")
      ("workers", po::value(&workers)->default_value(0), "threads checking images (0: all cores)");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data from-folder --input DIR --output X.h5",
                          context.rank())) {
    return kExitOk;
  }
  if (workers <= 0) workers = std::max(1u, std::thread::hardware_concurrency());
  MYRIAD_CHECK(fs::is_directory(input), "'{}' is not a directory", input);

  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(input)) {
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  MYRIAD_CHECK(!classes.empty(), "'{}' has no class subdirectories", input);
  std::vector<Entry> entries;
  int64_t skipped = 0;
  for (size_t label = 0; label < classes.size(); ++label) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(fs::path(input) / classes[label])) {
      if (!e.is_regular_file()) continue;
      if (is_image_file(e.path())) {
        files.push_back(e.path().string());
      } else {
        ++skipped;
      }
    }
    if (files.empty()) log_warn("class '{}' has no images", classes[label]);
    std::sort(files.begin(), files.end());
    for (std::string& f : files) entries.push_back({std::move(f), static_cast<int64_t>(label)});
  }
  MYRIAD_CHECK(!entries.empty(), "'{}' holds no .jpg, .jpeg or .png files", input);
  const int64_t n = static_cast<int64_t>(entries.size());
  log_info("{} images in {} classes under {}{}", n, classes.size(), input,
           skipped > 0 ? str_format(" ({} other files ignored)", skipped) : "");

  // Pass 1: every image must decode its header and share the first one's size.
  std::vector<ImageShape> shapes(static_cast<size_t>(n));
  ProgressBar checking("checking", n);
  std::mutex progress_mutex;
  parallel_for(n, workers, [&](int64_t i) {
    shapes[i] = decode_image_header(read_file(entries[i].path), "'" + entries[i].path + "'");
    std::lock_guard<std::mutex> lock(progress_mutex);
    checking.advance(1);
  });
  checking.finish();
  int channels = 1;
  for (int64_t i = 0; i < n; ++i) {
    MYRIAD_CHECK(shapes[i].height == shapes[0].height && shapes[i].width == shapes[0].width,
                 "'{}' is {}x{} but '{}' is {}x{}; all images of a dataset must have one size",
                 entries[i].path, shapes[i].height, shapes[i].width, entries[0].path,
                 shapes[0].height, shapes[0].width);
    channels = std::max(channels, shapes[i].channels);
  }

  // Pass 2: copy the bytes, block by block, so memory stays bounded.
  Hdf5ImageWriter writer(output, n, shapes[0].height, shapes[0].width, channels, /*encoded=*/true,
                         static_cast<int64_t>(classes.size()));
  writer.set_attribute("class_names", nlohmann::json(classes).dump());
  writer.set_attribute("source", input);
  ProgressBar writing("writing", n);
  const int64_t block = 1024;
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t count = std::min(block, n - begin);
    std::vector<std::string> images(static_cast<size_t>(count));
    std::vector<int64_t> labels(static_cast<size_t>(count));
    parallel_for(count, workers,
                 [&](int64_t i) { images[i] = read_file(entries[begin + i].path); });
    for (int64_t i = 0; i < count; ++i) labels[i] = entries[begin + i].label;
    writer.write_encoded(begin, images);
    writer.write_labels(begin, labels);
    writing.advance(count);
  }
  writer.finish();
  writing.finish();
  log_info("wrote {}: {} images {}x{}x{} (encoded), {} classes", output, n, shapes[0].height,
           shapes[0].width, channels, classes.size());
  return kExitOk;
}

}  // namespace myriad
