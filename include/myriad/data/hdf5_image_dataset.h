#pragma once

#include <memory>
#include <optional>
#include <string>

#include "myriad/data/image_source.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/file_io.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {

// The HDF5 image format of docs/data-format.md: /images raw uint8 [N, H, W, C] or encoded bytes
// (one JPEG/PNG per row), /labels int64 [N], attributes num_classes, height, width, channels.
// Opening validates the layout and every label; a bad file is an Error naming it. Files of
// verification pairs have no /labels (`labelled` false); their images all read as label 0.
// Raw images of at most `resident_bytes` in all (Fashion-MNIST, CIFAR-sized sets) are read into
// memory once at opening: a batch is then a few copies. Larger raw sets stored without filters
// are read with pread at the offsets HDF5 gives for their chunks, each image's bytes alone and
// back-to-back images in one read, from every loader worker at once: through HDF5, each image
// pulled its whole chunk and the workers queued for HDF5's lock (docs/data-format.md).
class Hdf5ImageDataset final : public ImageSource {
 public:
  static constexpr int64_t kResidentBytes = int64_t{1} << 30;

  explicit Hdf5ImageDataset(const std::string& path, bool labelled = true,
                            int64_t resident_bytes = kResidentBytes);

  const Hdf5File& file() const { return file_; }
  // How images are read: "encoded", "raw, held in memory", "raw, read directly" (pread) or
  // "raw, read through HDF5".
  const char* read_path() const;

  const DatasetInfo& info() const override { return info_; }
  int64_t label(int64_t index) const override { return labels_.empty() ? 0 : labels_.at(index); }
  void read(const std::vector<int64_t>& indices, uint8_t* out) const override;

 private:
  // /images' count, size and channels into info_, checked.
  void read_geometry();
  // /labels and the classes into labels_ and info_, checked.
  void read_labels();

  // Images `rows` (ascending, distinct) of a raw file, uint8 [n, H, W, C].
  torch::Tensor read_raw_rows(const std::vector<int64_t>& rows) const;

  Hdf5File file_;
  DatasetInfo info_;
  std::vector<int64_t> labels_;
  torch::Tensor resident_;  // uint8 [N, H, W, C] when the raw images are held in memory
  // Where the raw images lie in the file, and the file, when they are read without HDF5.
  std::optional<RowLayout> layout_;
  std::unique_ptr<ReadOnlyFile> direct_;
};

// Writes a dataset in that format, image by image or in blocks, under a temporary name that
// becomes `path` on finish(); an unfinished writer (an error unwound it) leaves nothing behind.
// With `num_classes` 0 the file is unlabelled (verification pairs: no /labels; write_issame).
class Hdf5ImageWriter {
 public:
  Hdf5ImageWriter(const std::string& path, int64_t size, int height, int width, int channels,
                  bool encoded, int64_t num_classes);
  ~Hdf5ImageWriter();

  // Raw pixels uint8 [n, H, W, C] for rows [begin, begin + n).
  void write_raw(int64_t begin, const uint8_t* pixels, int64_t n);
  void write_encoded(int64_t begin, const std::vector<std::string>& images);
  void write_labels(int64_t begin, const std::vector<int64_t>& labels);
  // /issame [size / 2]: 1 when images 2i and 2i+1 show one identity.
  void write_issame(const std::vector<uint8_t>& issame);
  void set_attribute(const std::string& key, const std::string& value);
  void set_attribute(const std::string& key, int64_t value);
  // The file being written, for datasets beside the images (the IJB file's templates and pairs).
  Hdf5File& file() { return *file_; }
  // Keeps only the first `size` images (and labels) of the `size` given at construction.
  void finish(int64_t size);
  void finish() { finish(size_); }

 private:
  std::unique_ptr<AtomicOutput> output_;
  std::unique_ptr<Hdf5File> file_;
  int64_t size_;
  int height_, width_, channels_;
  bool labelled_;
};

}  // namespace myriad
