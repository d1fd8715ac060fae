#pragma once

#include <hdf5.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace myriad {

// The dtype a tensor of `dtype` is stored as: bfloat16 and float16 as float32 and bool as uint8,
// types every HDF5 reader understands; the rest as they are. Hdf5File::write applies it; writers
// that fill allocate()d datasets themselves must too.
torch::ScalarType hdf5_stored_dtype(torch::ScalarType dtype);

// Where the rows (along dim 0) of a dataset stored as it is in memory lie in the file, so that
// they can be read with pread from any number of threads, without HDF5 and its lock: row r is
// row_bytes bytes at chunk_offsets[r / rows_per_chunk] + (r % rows_per_chunk) * row_bytes.
struct RowLayout {
  int64_t row_bytes = 0;
  int64_t rows_per_chunk = 0;          // every row, for a contiguous dataset
  std::vector<int64_t> chunk_offsets;  // -1: never written (reads as zeros)
};

// A thin RAII layer over the HDF5 C API for the tensors myriad stores: numeric datasets read and
// written whole or by ranges of rows (dim 0), variable-length byte strings (encoded images), and
// scalar attributes. Every failure throws an Error naming the file and the object.
class Hdf5File {
 public:
  enum class Mode { kRead, kReadWrite, kCreate };

  // kCreate truncates. A missing, unreadable or corrupt file is an Error naming it.
  Hdf5File(const std::string& path, Mode mode);
  ~Hdf5File();
  Hdf5File(Hdf5File&& other) noexcept;
  Hdf5File& operator=(Hdf5File&& other) noexcept;
  Hdf5File(const Hdf5File&) = delete;
  Hdf5File& operator=(const Hdf5File&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const;
  // Names of the datasets under `group`, recursively, relative to it ("a/b" for group/a/b).
  std::vector<std::string> list(const std::string& group) const;
  std::vector<int64_t> shape(const std::string& name) const;
  // The torch dtype a numeric dataset reads as (uint8, int32, int64, float32, float64, ...).
  torch::ScalarType dtype(const std::string& name) const;

  torch::Tensor read(const std::string& name) const;
  // Rows [begin, begin + count) along dim 0.
  torch::Tensor read_rows(const std::string& name, int64_t begin, int64_t count) const;
  // Rows listed by `rows` (ascending), read as one selection of hyperslabs.
  torch::Tensor read_row_list(const std::string& name, const std::vector<int64_t>& rows) const;

  // A dataset shaped like `tensor` (CPU, contiguous), written whole. `chunk_rows` > 0 chunks
  // the dataset along dim 0 (needed for later partial I/O of large datasets).
  void write(const std::string& name, const torch::Tensor& tensor, int64_t chunk_rows = 0);
  // An empty dataset to be filled by write_rows.
  void create(const std::string& name, torch::ScalarType dtype, const std::vector<int64_t>& shape,
              int64_t chunk_rows = 0);
  void write_rows(const std::string& name, int64_t begin, const torch::Tensor& rows);
  // A dataset whose bytes are written outside HDF5: contiguous, its space taken in the file at
  // once and never filled. Returns the file offset of its first byte (-1 when it has none), where
  // the data goes in C order, in the native layout of `dtype`.
  int64_t allocate(const std::string& name, torch::ScalarType dtype,
                   const std::vector<int64_t>& shape);
  // Where a contiguous dataset's bytes start in the file (C order, native layout); -1 for a
  // chunked or compact one, or one with no space yet.
  int64_t contiguous_offset(const std::string& name) const;
  // The RowLayout of a uint8 dataset stored contiguously or in chunks of whole rows, with no
  // filter; nullopt for any other (compressed, chunked across a row, compact), which HDF5 reads.
  std::optional<RowLayout> row_layout(const std::string& name) const;
  // Drops rows beyond `rows` from a chunked dataset (a conversion that skipped bad records).
  void shrink_rows(const std::string& name, int64_t rows);

  // Variable-length byte strings (one per row), for encoded images.
  void create_bytes(const std::string& name, int64_t count, int64_t chunk_rows);
  void write_bytes(const std::string& name, int64_t begin, const std::vector<std::string>& items);
  std::vector<std::string> read_bytes(const std::string& name, int64_t begin, int64_t count) const;
  // Rows listed by `rows` (ascending), in one read.
  std::vector<std::string> read_bytes_list(const std::string& name,
                                           const std::vector<int64_t>& rows) const;
  bool is_bytes(const std::string& name) const;

  // Scalar attributes on an object ("/" is the file). Getters return nullopt when absent.
  void set_attribute(const std::string& object, const std::string& key, int64_t value);
  void set_attribute(const std::string& object, const std::string& key, double value);
  void set_attribute(const std::string& object, const std::string& key, const std::string& value);
  std::optional<int64_t> int_attribute(const std::string& object, const std::string& key) const;
  std::optional<double> float_attribute(const std::string& object, const std::string& key) const;
  std::optional<std::string> string_attribute(const std::string& object,
                                              const std::string& key) const;

  // Writes buffered data to disk (H5Fflush).
  void flush();

 private:
  std::string where(const std::string& name) const;
  // A new dataset with the creation properties `configure` sets (given the dimensions); the file
  // offset of its data where it has one (contiguous and allocated), else -1.
  int64_t create_dataset(const std::string& name, torch::ScalarType dtype,
                         const std::vector<int64_t>& shape,
                         const std::function<void(hid_t, const std::vector<hsize_t>&)>& configure);
  hid_t file_ = -1;
  std::string path_;
};

}  // namespace myriad
