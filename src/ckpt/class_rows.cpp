#include "myriad/ckpt/class_rows.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <future>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {

namespace {

constexpr int64_t kBlockBytes = int64_t{256} << 20;
// Blocks read at once from a contiguous dataset: enough requests in flight to keep a disk (or the
// page cache's copies) busy, in as many buffers.
constexpr int64_t kReadAhead = 4;

// Rows [from, to) of a contiguous float32 dataset at `offset` of `path` (rows of `row` values),
// read with pread by kReadAhead threads, delivered to write() in order.
void read_contiguous_rows(const std::string& path, int64_t offset, int64_t row, int64_t from,
                          int64_t to, int64_t block, bool pinned,
                          const std::function<void(int64_t, const torch::Tensor&)>& write) {
  const ReadOnlyFile file(path);
  const int fd = file.fd();
  std::vector<torch::Tensor> buffers;
  const auto options = torch::TensorOptions(torch::kFloat32).pinned_memory(pinned);
  for (int64_t k = 0; k < kReadAhead && k * block < to - from; ++k)
    buffers.push_back(torch::empty({std::min(block, to - from), row}, options));
  std::deque<std::future<void>> reads;
  const auto launch = [&](int64_t b) {
    const int64_t count = std::min(block, to - b);
    torch::Tensor into = buffers[static_cast<size_t>((b - from) / block % kReadAhead)];
    reads.push_back(std::async(std::launch::async, [=] {
      read_at(fd, into.data_ptr(), count * row * 4, offset + b * row * 4, path);
    }));
  };
  int64_t next = from;
  for (; next < to && static_cast<int64_t>(reads.size()) < kReadAhead; next += block) launch(next);
  for (int64_t b = from; b < to; b += block) {
    // The caller's work on one block overlaps the reads of the next ones.
    std::future<void> read = std::move(reads.front());
    reads.pop_front();
    try {
      read.get();
    } catch (...) {
      for (std::future<void>& r : reads) r.wait();
      throw;
    }
    const int64_t count = std::min(block, to - b);
    write(b, buffers[static_cast<size_t>((b - from) / block % kReadAhead)].narrow(0, 0, count));
    if (next < to) {
      launch(next);
      next += block;
    }
  }
}

}  // namespace

int64_t rows_per_block(int64_t row_elements) {
  return std::max<int64_t>(1, kBlockBytes / 4 / std::max<int64_t>(1, row_elements));
}

void read_class_rows(const std::string& checkpoint, const Manifest& manifest,
                     const std::string& dataset, int64_t begin, int64_t end,
                     const std::function<void(int64_t, const torch::Tensor&)>& write, bool pinned) {
  MYRIAD_CHECK(0 <= begin && begin <= end && end <= manifest.num_classes,
               "classes [{}, {}) are outside the {} of checkpoint '{}'", begin, end,
               manifest.num_classes, checkpoint);
  const int64_t block = rows_per_block(manifest.embedding_size);
  for (const ShardEntry& s : manifest.shards) {
    const int64_t from = std::max(begin, s.class_offset);
    const int64_t to = std::min(end, s.class_offset + s.rows);
    if (from >= to) continue;
    const Hdf5File shard((std::filesystem::path(checkpoint) / s.file).string(),
                         Hdf5File::Mode::kRead);
    MYRIAD_CHECK(shard.has(dataset), "'{}' of '{}' has no {}: saved with another optimizer?",
                 s.file, checkpoint, dataset);
    MYRIAD_CHECK(shard.dtype(dataset) == torch::kFloat32, "'{}' of '{}': {} is {}, not float32",
                 s.file, checkpoint, dataset, c10::toString(shard.dtype(dataset)));
    const std::vector<int64_t> shape = shard.shape(dataset);
    MYRIAD_CHECK(shape == std::vector<int64_t>({s.rows, manifest.embedding_size}),
                 "'{}' of '{}': {} has shape {}, its manifest says [{}, {}]", s.file, checkpoint,
                 dataset, c10::IntArrayRef(shape), s.rows, manifest.embedding_size);
    const std::string path = (std::filesystem::path(checkpoint) / s.file).string();
    const int64_t offset = shard.contiguous_offset(dataset);
    if (offset >= 0) {
      read_contiguous_rows(
          path, offset, manifest.embedding_size, from - s.class_offset, to - s.class_offset, block,
          pinned,
          [&](int64_t at, const torch::Tensor& rows) { write(at + s.class_offset - begin, rows); });
      continue;
    }
    // Chunked: written before the saves went around HDF5.
    for (int64_t b = from; b < to; b += block) {
      const int64_t count = std::min(block, to - b);
      write(b - begin, shard.read_rows(dataset, b - s.class_offset, count));
    }
  }
}

}  // namespace myriad
