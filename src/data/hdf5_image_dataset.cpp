#include "myriad/data/hdf5_image_dataset.h"

#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "myriad/data/image_codec.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

constexpr int64_t kFormatVersion = 1;
// Rows per HDF5 chunk of encoded images, and at most of raw ones: small enough that reading one
// image reads little else.
constexpr int64_t kChunkRows = 64;
// Raw chunks stay within HDF5's default chunk cache (1 MiB), so that readers through HDF5 (h5py)
// that take one image at a time do not read its whole chunk each time.
constexpr int64_t kRawChunkBytes = int64_t{1} << 20;

int64_t required_attribute(const Hdf5File& file, const std::string& key) {
  const std::optional<int64_t> value = file.int_attribute("/", key);
  MYRIAD_CHECK(value.has_value(), "'{}' has no attribute '{}' (see docs/data-format.md)",
               file.path(), key);
  return *value;
}

}  // namespace

Hdf5ImageDataset::Hdf5ImageDataset(const std::string& path, bool labelled, int64_t resident_bytes)
    : file_(path, Hdf5File::Mode::kRead) {
  MYRIAD_CHECK(file_.has("images") && (!labelled || file_.has("labels")),
               "'{}' is not a myriad image dataset: it needs /images{} (see docs/data-format.md)",
               path, labelled ? " and /labels" : "");
  info_.name = path;
  read_geometry();
  const int64_t image_bytes = static_cast<int64_t>(info_.height) * info_.width * info_.channels;
  if (!info_.encoded && info_.size <= resident_bytes / image_bytes) {
    resident_ = file_.read("images");
  } else if (!info_.encoded) {
    layout_ = file_.row_layout("images");
    if (layout_) direct_ = std::make_unique<ReadOnlyFile>(path);
  }
  if (labelled) read_labels();
}

void Hdf5ImageDataset::read_geometry() {
  const std::string& path = info_.name;
  info_.encoded = file_.is_bytes("images");
  const std::vector<int64_t> shape = file_.shape("images");
  info_.size = shape.empty() ? 0 : shape[0];
  int64_t height = 0, width = 0, channels = 0;
  if (info_.encoded) {
    MYRIAD_CHECK(shape.size() == 1, "'{}': encoded /images must be one byte string per image",
                 path);
    height = required_attribute(file_, "height");
    width = required_attribute(file_, "width");
    channels = required_attribute(file_, "channels");
  } else {
    MYRIAD_CHECK(shape.size() == 4 && file_.dtype("images") == torch::kUInt8,
                 "'{}': raw /images must be uint8 [N, H, W, C]", path);
    height = shape[1];
    width = shape[2];
    channels = shape[3];
  }
  MYRIAD_CHECK(channels == 1 || channels == 3,
               "'{}': images have {} channels; 1 or 3 are supported", path, channels);
  MYRIAD_CHECK(height > 0 && width > 0 && height <= kMaxImageSide && width <= kMaxImageSide,
               "'{}': image size {}x{} (1 to {} pixels per side are supported)", path, height,
               width, kMaxImageSide);
  info_.height = static_cast<int>(height);
  info_.width = static_cast<int>(width);
  info_.channels = static_cast<int>(channels);
}

void Hdf5ImageDataset::read_labels() {
  const std::string& path = info_.name;
  const std::vector<int64_t> label_shape = file_.shape("labels");
  MYRIAD_CHECK(label_shape.size() == 1 && label_shape[0] == info_.size,
               "'{}': {} images but {} labels", path, info_.size,
               label_shape.empty() ? 0 : label_shape[0]);
  MYRIAD_CHECK(!torch::isFloatingType(file_.dtype("labels")),
               "'{}': /labels are floating point; class labels are integers", path);
  const torch::Tensor labels = file_.read("labels").to(torch::kInt64).contiguous();
  labels_.assign(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
  const std::optional<int64_t> classes = file_.int_attribute("/", "num_classes");
  const int64_t max_label =
      labels_.empty() ? -1 : *std::max_element(labels_.begin(), labels_.end());
  // Without the attribute the classes are 0 ... the largest label (which must leave room for + 1).
  MYRIAD_CHECK(classes || max_label < std::numeric_limits<int64_t>::max(),
               "'{}': label {} is too large, and there is no num_classes attribute", path,
               max_label);
  info_.num_classes = classes ? *classes : max_label + 1;
  MYRIAD_CHECK(info_.num_classes > 0 || labels_.empty(), "'{}': num_classes is {}", path,
               info_.num_classes);
  for (size_t i = 0; i < labels_.size(); ++i) {
    MYRIAD_CHECK(labels_[i] >= 0 && labels_[i] < info_.num_classes,
                 "'{}': label {} of image {} is outside [0, {})", path, labels_[i], i,
                 info_.num_classes);
  }
}

void Hdf5ImageDataset::read(const std::vector<int64_t>& indices, uint8_t* out) const {
  const int64_t image_bytes = static_cast<int64_t>(info_.height) * info_.width * info_.channels;
  // One HDF5 read for the whole batch, in file order; then each image goes to its slot.
  std::vector<size_t> order(indices.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return indices[a] < indices[b]; });
  std::vector<int64_t> rows;
  std::vector<std::vector<size_t>> slots;
  for (size_t k : order) {
    const int64_t index = indices[k];
    MYRIAD_CHECK(index >= 0 && index < info_.size, "image {} is outside '{}' ({} images)", index,
                 info_.name, info_.size);
    if (rows.empty() || rows.back() != index) {
      rows.push_back(index);
      slots.emplace_back();
    }
    slots.back().push_back(k);
  }
  if (info_.encoded) {
    const std::vector<std::string> images = file_.read_bytes_list("images", rows);
    for (size_t r = 0; r < rows.size(); ++r) {
      uint8_t* first = out + static_cast<int64_t>(slots[r][0]) * image_bytes;
      decode_image(images[r], info_.height, info_.width, info_.channels, first,
                   str_format("image {} of '{}'", rows[r], info_.name));
      for (size_t s = 1; s < slots[r].size(); ++s) {
        std::memcpy(out + static_cast<int64_t>(slots[r][s]) * image_bytes, first, image_bytes);
      }
    }
    return;
  }
  const torch::Tensor pixels = resident_.defined() ? resident_ : read_raw_rows(rows);
  const uint8_t* source = pixels.data_ptr<uint8_t>();
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t row = resident_.defined() ? rows[r] : static_cast<int64_t>(r);
    for (size_t slot : slots[r]) {
      std::memcpy(out + static_cast<int64_t>(slot) * image_bytes, source + row * image_bytes,
                  image_bytes);
    }
  }
}

const char* Hdf5ImageDataset::read_path() const {
  if (info_.encoded) return "encoded";
  if (resident_.defined()) return "raw, held in memory";
  return layout_ ? "raw, read directly" : "raw, read through HDF5";
}

torch::Tensor Hdf5ImageDataset::read_raw_rows(const std::vector<int64_t>& rows) const {
  if (!layout_) return file_.read_row_list("images", rows);
  const int64_t n = static_cast<int64_t>(rows.size());
  torch::Tensor out = torch::empty({n, info_.height, info_.width, info_.channels}, torch::kUInt8);
  uint8_t* into = out.data_ptr<uint8_t>();
  const RowLayout& layout = *layout_;
  const auto offset = [&](int64_t row) {
    const int64_t chunk = layout.chunk_offsets[row / layout.rows_per_chunk];
    return chunk < 0 ? -1 : chunk + row % layout.rows_per_chunk * layout.row_bytes;
  };
  // Each run of images that lie back to back in the file is one read.
  for (int64_t i = 0; i < n;) {
    const int64_t first = offset(rows[i]);
    int64_t j = i + 1;
    while (first >= 0 && j < n && offset(rows[j]) == first + (j - i) * layout.row_bytes) ++j;
    if (first < 0) {
      std::memset(into + i * layout.row_bytes, 0, layout.row_bytes);  // as HDF5's fill value
    } else {
      read_at(direct_->fd(), into + i * layout.row_bytes, (j - i) * layout.row_bytes, first,
              info_.name);
    }
    i = j;
  }
  return out;
}

Hdf5ImageWriter::Hdf5ImageWriter(const std::string& path, int64_t size, int height, int width,
                                 int channels, bool encoded, int64_t num_classes)
    : output_(std::make_unique<AtomicOutput>(path)),
      size_(size),
      height_(height),
      width_(width),
      channels_(channels),
      labelled_(num_classes > 0) {
  file_ = std::make_unique<Hdf5File>(output_->temporary_path(), Hdf5File::Mode::kCreate);
  if (encoded) {
    file_->create_bytes("images", size, kChunkRows);
  } else {
    const int64_t image_bytes = static_cast<int64_t>(height) * width * channels;
    file_->create("images", torch::kUInt8, {size, height, width, channels},
                  std::clamp<int64_t>(kRawChunkBytes / image_bytes, 1, kChunkRows));
  }
  if (labelled_) {
    file_->create("labels", torch::kInt64, {size}, 4096);
    file_->set_attribute("/", "num_classes", num_classes);
  }
  file_->set_attribute("/", "format", std::string("myriad-images"));
  file_->set_attribute("/", "format_version", kFormatVersion);
  file_->set_attribute("/", "encoding", std::string(encoded ? "encoded" : "raw"));
  file_->set_attribute("/", "height", static_cast<int64_t>(height));
  file_->set_attribute("/", "width", static_cast<int64_t>(width));
  file_->set_attribute("/", "channels", static_cast<int64_t>(channels));
}

Hdf5ImageWriter::~Hdf5ImageWriter() {
  // Close the file before AtomicOutput removes an unfinished one.
  file_.reset();
}

void Hdf5ImageWriter::write_raw(int64_t begin, const uint8_t* pixels, int64_t n) {
  const torch::Tensor block = torch::from_blob(const_cast<uint8_t*>(pixels),
                                               {n, height_, width_, channels_}, torch::kUInt8);
  file_->write_rows("images", begin, block);
}

void Hdf5ImageWriter::write_encoded(int64_t begin, const std::vector<std::string>& images) {
  file_->write_bytes("images", begin, images);
}

void Hdf5ImageWriter::write_labels(int64_t begin, const std::vector<int64_t>& labels) {
  MYRIAD_CHECK(labelled_, "write_labels on an unlabelled file");
  const torch::Tensor block = torch::from_blob(
      const_cast<int64_t*>(labels.data()), {static_cast<int64_t>(labels.size())}, torch::kInt64);
  file_->write_rows("labels", begin, block);
}

void Hdf5ImageWriter::set_attribute(const std::string& key, const std::string& value) {
  file_->set_attribute("/", key, value);
}

void Hdf5ImageWriter::set_attribute(const std::string& key, int64_t value) {
  file_->set_attribute("/", key, value);
}

void Hdf5ImageWriter::write_issame(const std::vector<uint8_t>& issame) {
  MYRIAD_CHECK(static_cast<int64_t>(issame.size()) * 2 == size_,
               "{} pairs need {} images; the file has {}", issame.size(), 2 * issame.size(), size_);
  file_->write("issame", torch::from_blob(const_cast<uint8_t*>(issame.data()),
                                          {static_cast<int64_t>(issame.size())}, torch::kUInt8));
}

void Hdf5ImageWriter::finish(int64_t size) {
  if (size != size_) {
    file_->shrink_rows("images", size);
    if (labelled_) file_->shrink_rows("labels", size);
  }
  file_->flush();
  file_.reset();
  output_->commit();
}

}  // namespace myriad
