#include "myriad/data/ijb_conversion.h"

#include <torch/types.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <unordered_set>
#include <vector>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/log.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

// Images aligned between two HDF5 writes: 38.5 MB, enough that a block keeps every core busy.
constexpr int64_t kBlockImages = 1024;
constexpr int kChannels = 3;
constexpr int64_t kImageBytes = int64_t{kAlignedSide} * kAlignedSide * kChannels;

// Decodes the loose crop of face `i` and aligns it into `out`.
void align_one(const IjbLayout& layout, const IjbMeta& meta, int64_t i, uint8_t* out) {
  Affine to_face;
  try {
    to_face = alignment_transform(meta.landmarks.points[i]);
  } catch (const Error& e) {
    MYRIAD_THROW("'{}' line {}: {}", layout.landmarks, meta.landmarks.lines[i], e.message());
  }
  const std::string path = layout.loose_crop + "/" + meta.faces.images[i];
  try {
    const std::string bytes = read_whole_file(path);
    const std::string what = "'" + path + "'";
    const ImageShape shape = decode_image_header(bytes, what);
    std::vector<uint8_t> pixels(static_cast<size_t>(shape.height) * shape.width * kChannels);
    decode_image(bytes, shape.height, shape.width, kChannels, pixels.data(), what);
    warp_affine({pixels.data(), shape.height, shape.width, kChannels}, to_face, kAlignedSide,
                kAlignedSide, out);
  } catch (const Error& e) {
    MYRIAD_THROW("{} (the image of '{}' line {})", e.message(), layout.faces, meta.faces.lines[i]);
  }
}

// Every aligned face into `writer`, a block at a time: while one block is written, the workers
// align the next into the other buffer.
void align_all(const IjbLayout& layout, const IjbMeta& meta, int workers, Hdf5ImageWriter& writer) {
  const int64_t n = static_cast<int64_t>(meta.faces.images.size());
  std::array<std::vector<uint8_t>, 2> buffers;
  for (std::vector<uint8_t>& b : buffers) b.resize(static_cast<size_t>(kBlockImages * kImageBytes));
  std::future<void> writing;
  ProgressBar progress("aligning", n);
  for (int64_t begin = 0, block = 0; begin < n; begin += kBlockImages, ++block) {
    const int64_t count = std::min(kBlockImages, n - begin);
    uint8_t* pixels = buffers[block % 2].data();
    parallel_for(count, workers,
                 [&](int64_t i) { align_one(layout, meta, begin + i, pixels + i * kImageBytes); });
    if (writing.valid()) writing.get();
    writing = std::async(std::launch::async, [&writer, begin, pixels, count] {
      writer.write_raw(begin, pixels, count);
    });
    progress.advance(count);
  }
  writing.get();
  progress.finish();
}

template <class T>
torch::Tensor view_of(const std::vector<T>& values, std::vector<int64_t> shape,
                      torch::ScalarType dtype) {
  return torch::from_blob(const_cast<T*>(values.data()), shape, dtype);
}

// The datasets beside the images.
void write_meta(Hdf5File& file, const IjbMeta& meta) {
  const int64_t n = static_cast<int64_t>(meta.faces.images.size());
  const int64_t p = static_cast<int64_t>(meta.pairs.labels.size());
  file.write("templates", view_of(meta.faces.templates, {n}, torch::kInt64));
  file.write("medias", view_of(meta.faces.medias, {n}, torch::kInt64));
  file.write("scores", view_of(meta.landmarks.scores, {n}, torch::kFloat32));
  file.write("pairs", view_of(meta.pairs.templates, {p, 2}, torch::kInt64));
  file.write("pair_labels", view_of(meta.pairs.labels, {p}, torch::kUInt8));
}

}  // namespace

IjbConversionSummary convert_ijb(const IjbConversion& conversion) {
  const auto start = std::chrono::steady_clock::now();
  const IjbLayout layout = ijb_layout(conversion.root, conversion.target);
  const IjbMeta meta = read_ijb_meta(layout);
  IjbConversionSummary summary;
  summary.images = static_cast<int64_t>(meta.faces.images.size());
  summary.templates = static_cast<int64_t>(
      std::unordered_set<int64_t>(meta.faces.templates.begin(), meta.faces.templates.end()).size());
  summary.pairs = static_cast<int64_t>(meta.pairs.labels.size());
  summary.genuine = std::count(meta.pairs.labels.begin(), meta.pairs.labels.end(), 1);
  summary.meta_seconds = seconds_since(start);
  log_info("{} ({}): {} images of {} templates, {} pairs ({} genuine); meta files read in {:.1f} s",
           conversion.root, ijb_target_name(conversion.target), summary.images, summary.templates,
           summary.pairs, summary.genuine, summary.meta_seconds);

  Hdf5ImageWriter writer(conversion.output, summary.images, kAlignedSide, kAlignedSide, kChannels,
                         /*encoded=*/false, /*num_classes=*/0);
  writer.set_attribute("ijb_target", ijb_target_name(conversion.target));
  writer.set_attribute("alignment", std::string(kIjbAlignment));
  writer.set_attribute("source", conversion.root);
  write_meta(writer.file(), meta);
  align_all(layout, meta, conversion.workers, writer);
  writer.finish();
  summary.align_seconds = seconds_since(start) - summary.meta_seconds;
  return summary;
}

}  // namespace myriad
