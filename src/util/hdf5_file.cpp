#include "myriad/util/hdf5_file.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include "myriad/util/check_hdf5.h"
#include "myriad/util/error.h"
#include "myriad/util/file_io.h"

// H5Pset_file_locking came with HDF5 1.10.7 and 1.12.1 (not 1.12.0).
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
#define MYRIAD_HDF5_FILE_LOCKING_PROPERTY 1
#endif

namespace myriad {

namespace {

// HDF5 builds without thread safety must not be entered from two threads at once; the data
// loader's workers read concurrently.
std::unique_lock<std::recursive_mutex> hdf5_lock() {
  static std::recursive_mutex mutex;
  static std::once_flag quiet;
  // Errors are reported through exceptions, not printed by HDF5 itself.
  std::call_once(quiet, [] {
    // HDF5's own clean-up at exit crashes (1.10) on a file whose write failed (a full disk). Every
    // file is closed by its Hdf5File, so the clean-up is not needed.
    H5dont_atexit();
#ifndef MYRIAD_HDF5_FILE_LOCKING_PROPERTY
    // The only switch older libraries have (see file_access), read at every open; a value the
    // user set stays.
    setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
#endif
  });
  // A thread-safe library keeps the error settings per thread: the data loader's workers and the
  // checkpoint writers have their own.
  thread_local const bool silenced = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)silenced;
  static const bool threadsafe = [] {
    hbool_t safe = 0;
    return H5is_library_threadsafe(&safe) >= 0 && safe;
  }();
  return threadsafe ? std::unique_lock<std::recursive_mutex>()
                    : std::unique_lock<std::recursive_mutex>(mutex);
}

// Closes an HDF5 id when leaving scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// How every file is opened: without HDF5's file locks. myriad never reads a file that another
// process writes at the same time (checkpoints are written under a temporary name and renamed
// into place), so the locks protect nothing, and file systems without lock support (NFS without
// a lock daemon answers flock() with ENOLCK) would refuse every open. HDF5_USE_FILE_LOCKING in
// the environment still overrides this. The caller closes the list.
hid_t file_access() {
  const hid_t access = H5Pcreate(H5P_FILE_ACCESS);
  MYRIAD_CHECK(access >= 0, "cannot create an HDF5 file access list: {}",
               detail::hdf5_error_stack());
#ifdef MYRIAD_HDF5_FILE_LOCKING_PROPERTY
  if (H5Pset_file_locking(access, false, true) < 0) {
    const std::string stack = detail::hdf5_error_stack();
    H5Pclose(access);
    MYRIAD_THROW("cannot turn HDF5's file locking off: {}", stack);
  }
#endif
  // Objects of 64 KiB and more start on a page, so that the writes filling them (checkpoint
  // shards written outside HDF5) are page-aligned.
  if (H5Pset_alignment(access, hsize_t{64} << 10, 4096) < 0) {
    const std::string stack = detail::hdf5_error_stack();
    H5Pclose(access);
    MYRIAD_THROW("cannot set HDF5's alignment: {}", stack);
  }
  return access;
}

hid_t native_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kUInt8:
      return H5T_NATIVE_UINT8;
    case torch::kInt8:
      return H5T_NATIVE_INT8;
    case torch::kInt16:
      return H5T_NATIVE_INT16;
    case torch::kInt32:
      return H5T_NATIVE_INT32;
    case torch::kInt64:
      return H5T_NATIVE_INT64;
    case torch::kFloat32:
      return H5T_NATIVE_FLOAT;
    case torch::kFloat64:
      return H5T_NATIVE_DOUBLE;
    default:
      MYRIAD_THROW("HDF5 has no native type for {}", c10::toString(dtype));
  }
}

// `t` as Hdf5File::write stores it: on the CPU, contiguous, in its stored dtype.
torch::Tensor storable(const torch::Tensor& t) {
  return t.to(torch::kCPU).to(hdf5_stored_dtype(t.scalar_type())).contiguous();
}

// A damaged or hostile file can declare a dataset of terabytes in a few bytes; HDF5 reads the
// unwritten parts as fill values, so a read would allocate for all of it. Reads above
// kTrustedReadBytes therefore need stored data behind them, allowing for compression up to
// kMaxCompression.
constexpr int64_t kTrustedReadBytes = int64_t{64} << 20;
constexpr int64_t kMaxCompression = 4096;

// Bytes of `shape` in elements of `element_size` bytes; an Error when that overflows.
int64_t checked_bytes(const std::vector<int64_t>& shape, int64_t element_size,
                      const std::string& where) {
  int64_t bytes = element_size;
  for (const int64_t d : shape) {
    MYRIAD_CHECK(d >= 0 && (d == 0 || bytes <= std::numeric_limits<int64_t>::max() / d),
                 "{} declares a shape too large to read", where);
    bytes *= d;
  }
  return bytes;
}

void check_stored(hid_t dataset, int64_t bytes, const std::string& where) {
  if (bytes <= kTrustedReadBytes) return;
  const auto stored = static_cast<int64_t>(H5Dget_storage_size(dataset));
  MYRIAD_CHECK(stored >= bytes / kMaxCompression,
               "{}: reading {} bytes of it, but the file stores only {} for it (damaged, or "
               "declared larger than what was written)",
               where, bytes, stored);
}

std::vector<hsize_t> dims_of(const std::vector<int64_t>& shape) {
  return {shape.begin(), shape.end()};
}

}  // namespace

torch::ScalarType hdf5_stored_dtype(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16 || dtype == torch::kFloat16) return torch::kFloat32;
  if (dtype == torch::kBool) return torch::kUInt8;
  return dtype;
}

Hdf5File::Hdf5File(const std::string& path, Mode mode) : path_(path) {
  auto lock = hdf5_lock();
  if (mode == Mode::kCreate) {
    const Handle access(file_access(), H5Pclose);
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get());
    MYRIAD_CHECK(file_ >= 0, "cannot create HDF5 file '{}': {}", path, detail::hdf5_error_stack());
    return;
  }
  MYRIAD_CHECK(access(path.c_str(), F_OK) == 0, "'{}' does not exist", path);
  MYRIAD_CHECK(access(path.c_str(), mode == Mode::kRead ? R_OK : R_OK | W_OK) == 0,
               "'{}' is not {}", path, mode == Mode::kRead ? "readable" : "writable");
  MYRIAD_CHECK(H5Fis_hdf5(path.c_str()) > 0,
               "'{}' is not an HDF5 file (or is truncated or corrupt)", path);
  const Handle access(file_access(), H5Pclose);
  file_ = H5Fopen(path.c_str(), mode == Mode::kRead ? H5F_ACC_RDONLY : H5F_ACC_RDWR, access.get());
  MYRIAD_CHECK(file_ >= 0, "cannot open HDF5 file '{}': {}", path, detail::hdf5_error_stack());
}

Hdf5File::~Hdf5File() {
  if (file_ >= 0) {
    auto lock = hdf5_lock();
    H5Fclose(file_);
  }
}

Hdf5File::Hdf5File(Hdf5File&& other) noexcept : file_(other.file_), path_(std::move(other.path_)) {
  other.file_ = -1;
}

Hdf5File& Hdf5File::operator=(Hdf5File&& other) noexcept {
  std::swap(file_, other.file_);
  std::swap(path_, other.path_);
  return *this;
}

std::string Hdf5File::where(const std::string& name) const {
  return str_format("'{}' in '{}'", name, path_);
}

bool Hdf5File::has(const std::string& name) const {
  auto lock = hdf5_lock();
  if (name.empty() || name == "/") return true;
  // Each level must exist before the next can be asked about.
  size_t pos = 0;
  while ((pos = name.find('/', pos + 1)) != std::string::npos) {
    if (H5Lexists(file_, name.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return H5Lexists(file_, name.c_str(), H5P_DEFAULT) > 0;
}

namespace {

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET && std::string(name) != ".") {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  }
  return 0;
}

}  // namespace

std::vector<std::string> Hdf5File::list(const std::string& group) const {
  auto lock = hdf5_lock();
  std::vector<std::string> names;
  MYRIAD_CHECK(has(group), "{} has no group {}", path_, group);
  Handle object(H5Oopen(file_, group.c_str(), H5P_DEFAULT), H5Oclose);
  MYRIAD_CHECK_HDF5(object.get(), "opening " + where(group));
  MYRIAD_CHECK_HDF5(H5Ovisit(object.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names),
                    "listing " + where(group));
  return names;
}

std::vector<int64_t> Hdf5File::shape(const std::string& name) const {
  auto lock = hdf5_lock();
  MYRIAD_CHECK(has(name), "{} has no dataset {}", path_, name);
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  MYRIAD_CHECK_HDF5(space.get(), "reading the shape of " + where(name));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  MYRIAD_CHECK_HDF5(rank, "reading the shape of " + where(name));
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

namespace {

// Chunk addresses count from the end of a user block before HDF5 1.14.4 and from the file's start
// after it (HDF5's issue 3003); H5Dget_offset has always counted from the file's start.
bool chunk_addresses_skip_user_block() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::make_tuple(major, minor, release) < std::make_tuple(1u, 14u, 4u);
}

// Whether the unwritten rows of a dataset read as zeros: h5py can give another fill value.
bool fills_with_zeros(hid_t properties) {
  H5D_fill_value_t status = H5D_FILL_VALUE_UNDEFINED;
  if (H5Pfill_value_defined(properties, &status) < 0) return false;
  if (status != H5D_FILL_VALUE_USER_DEFINED) return true;
  uint8_t fill = 0;
  return H5Pget_fill_value(properties, H5T_NATIVE_UINT8, &fill) >= 0 && fill == 0;
}

// The file offset of each chunk of whole rows of an unfiltered chunked dataset into `layout`, or
// false where its chunks are not whole rows stored as they are.
bool locate_chunks(hid_t file, hid_t dataset, hid_t properties, const std::vector<int64_t>& dims,
                   const std::string& what, RowLayout& layout) {
  if (H5Pget_nfilters(properties) != 0) return false;
  std::vector<hsize_t> chunk(dims.size());
  MYRIAD_CHECK_HDF5(H5Pget_chunk(properties, static_cast<int>(chunk.size()), chunk.data()),
                    "reading the chunks of " + what);
  for (size_t d = 1; d < dims.size(); ++d) {
    if (chunk[d] != static_cast<hsize_t>(dims[d])) return false;
  }
  layout.rows_per_chunk = static_cast<int64_t>(chunk[0]);
  // Locating each chunk costs about a microsecond: a grid of more (rows declared far beyond those
  // written, or a very large set of one row per chunk) is left to HDF5 rather than slow the open.
  constexpr int64_t kMaxChunks = int64_t{1} << 20;
  if ((dims[0] + layout.rows_per_chunk - 1) / layout.rows_per_chunk > kMaxChunks) return false;
  hsize_t user_block = 0;
  Handle file_properties(H5Fget_create_plist(file), H5Pclose);
  MYRIAD_CHECK_HDF5(H5Pget_userblock(file_properties.get(), &user_block),
                    "reading the user block of " + what);
  const int64_t shift = chunk_addresses_skip_user_block() ? static_cast<int64_t>(user_block) : 0;
  std::vector<hsize_t> at(dims.size(), 0);
  for (int64_t first = 0; first < dims[0]; first += layout.rows_per_chunk) {
    at[0] = static_cast<hsize_t>(first);
    unsigned filters = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t size = 0;
    MYRIAD_CHECK_HDF5(H5Dget_chunk_info_by_coord(dataset, at.data(), &filters, &address, &size),
                      "locating the chunk of row " + std::to_string(first) + " of " + what);
    // A chunk stored at another size than its rows' is not what it claims to be: HDF5 reads it.
    if (address != HADDR_UNDEF &&
        static_cast<int64_t>(size) != layout.rows_per_chunk * layout.row_bytes)
      return false;
    layout.chunk_offsets.push_back(address == HADDR_UNDEF ? -1
                                                          : static_cast<int64_t>(address) + shift);
  }
  return true;
}

// Whether the first stored chunk's first and last rows, read at `layout`'s offsets, are the rows
// HDF5 reads: the offsets' meaning has moved between HDF5's versions, and a wrong one must not
// feed the loader other bytes.
bool agrees_with_hdf5(const Hdf5File& file, const std::string& name, int64_t rows,
                      const RowLayout& layout) {
  const auto stored = std::find_if(layout.chunk_offsets.begin(), layout.chunk_offsets.end(),
                                   [](int64_t offset) { return offset >= 0; });
  if (stored == layout.chunk_offsets.end()) return true;  // every row reads as zeros
  const int64_t first = (stored - layout.chunk_offsets.begin()) * layout.rows_per_chunk;
  const int64_t last = std::min(first + layout.rows_per_chunk, rows) - 1;
  const ReadOnlyFile bytes(file.path());
  std::vector<uint8_t> row(static_cast<size_t>(layout.row_bytes));
  for (const int64_t r : {first, last}) {
    const int64_t offset = *stored + (r - first) * layout.row_bytes;
    if (offset + layout.row_bytes > bytes.size()) return false;
    read_at(bytes.fd(), row.data(), layout.row_bytes, offset, file.path());
    const torch::Tensor expected = file.read_rows(name, r, 1);
    if (std::memcmp(row.data(), expected.data_ptr(), row.size()) != 0) return false;
  }
  return true;
}

}  // namespace

std::optional<RowLayout> Hdf5File::row_layout(const std::string& name) const {
  const std::vector<int64_t> dims = shape(name);
  if (dims.empty() || dtype(name) != torch::kUInt8) return std::nullopt;
  auto lock = hdf5_lock();
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle properties(H5Dget_create_plist(dataset.get()), H5Pclose);
  MYRIAD_CHECK_HDF5(properties.get(), "reading the layout of " + where(name));
  // Bytes kept in another file, and unwritten rows that read as other than zeros, are HDF5's.
  if (H5Pget_external_count(properties.get()) != 0 || !fills_with_zeros(properties.get()))
    return std::nullopt;
  RowLayout layout;
  layout.row_bytes = 1;
  for (size_t d = 1; d < dims.size(); ++d) layout.row_bytes *= dims[d];
  const H5D_layout_t kind = H5Pget_layout(properties.get());
  if (kind == H5D_CONTIGUOUS) {
    layout.rows_per_chunk = std::max<int64_t>(dims[0], 1);
    layout.chunk_offsets = {contiguous_offset(name)};
    if (layout.chunk_offsets[0] < 0) return std::nullopt;  // not stored yet
  } else if (kind != H5D_CHUNKED ||
             !locate_chunks(file_, dataset.get(), properties.get(), dims, where(name), layout)) {
    return std::nullopt;
  }
  if (!agrees_with_hdf5(*this, name, dims[0], layout)) return std::nullopt;
  return layout;
}

void Hdf5File::shrink_rows(const std::string& name, int64_t rows) {
  std::vector<int64_t> shape_now = shape(name);
  MYRIAD_CHECK(!shape_now.empty() && rows >= 0 && rows <= shape_now[0],
               "cannot shrink {} to {} rows", where(name), rows);
  auto lock = hdf5_lock();
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  std::vector<hsize_t> dims(shape_now.begin(), shape_now.end());
  dims[0] = static_cast<hsize_t>(rows);
  MYRIAD_CHECK_HDF5(H5Dset_extent(dataset.get(), dims.data()), "shrinking " + where(name));
}

torch::ScalarType Hdf5File::dtype(const std::string& name) const {
  auto lock = hdf5_lock();
  MYRIAD_CHECK(has(name), "{} has no dataset {}", path_, name);
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  const H5T_class_t type_class = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (type_class == H5T_FLOAT) return size == 8 ? torch::kFloat64 : torch::kFloat32;
  if (type_class == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
    if (size == 1) return is_signed ? torch::kInt8 : torch::kUInt8;
    if (size == 2) return is_signed ? torch::kInt16 : torch::kInt32;
    if (size == 4) return is_signed ? torch::kInt32 : torch::kInt64;
    return torch::kInt64;
  }
  MYRIAD_THROW("{} is not a numeric dataset", where(name));
}

torch::Tensor Hdf5File::read(const std::string& name) const {
  const std::vector<int64_t> dims = shape(name);
  return read_rows(name, 0, dims.empty() ? 1 : dims[0]);
}

torch::Tensor Hdf5File::read_rows(const std::string& name, int64_t begin, int64_t count) const {
  auto lock = hdf5_lock();
  std::vector<int64_t> dims = shape(name);
  const torch::ScalarType type = dtype(name);
  if (dims.empty()) {
    torch::Tensor scalar = torch::empty({}, type);
    Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
    MYRIAD_CHECK_HDF5(
        H5Dread(dataset.get(), native_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, scalar.data_ptr()),
        "reading " + where(name));
    return scalar;
  }
  MYRIAD_CHECK(begin >= 0 && count >= 0 && begin + count <= dims[0],
               "rows [{}, {}) are outside {} of {} rows", begin, begin + count, where(name),
               dims[0]);
  std::vector<int64_t> out_shape = dims;
  out_shape[0] = count;
  const int64_t bytes =
      checked_bytes(out_shape, static_cast<int64_t>(torch::elementSize(type)), where(name));
  if (bytes == 0) return torch::empty(out_shape, type);
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  check_stored(dataset.get(), bytes, where(name));
  torch::Tensor out = torch::empty(out_shape, type);
  Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
  std::vector<hsize_t> start(dims.size(), 0), extent = dims_of(out_shape);
  start[0] = static_cast<hsize_t>(begin);
  MYRIAD_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                        extent.data(), nullptr),
                    "selecting rows of " + where(name));
  Handle memory_space(H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr),
                      H5Sclose);
  MYRIAD_CHECK_HDF5(H5Dread(dataset.get(), native_type(type), memory_space.get(), file_space.get(),
                            H5P_DEFAULT, out.data_ptr()),
                    "reading " + where(name));
  return out;
}

namespace {

// The listed rows (ascending, inside [0, dims[0])) as runs of consecutive rows: {first, count}.
std::vector<std::pair<hsize_t, hsize_t>> row_runs(const std::vector<int64_t>& dims,
                                                  const std::vector<int64_t>& rows,
                                                  const std::string& where) {
  std::vector<std::pair<hsize_t, hsize_t>> runs;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    MYRIAD_CHECK(rows[i] >= 0 && rows[j - 1] < dims[0] && (i == 0 || rows[i] > rows[i - 1]),
                 "row list for {} must be ascending and inside [0, {})", where, dims[0]);
    runs.emplace_back(static_cast<hsize_t>(rows[i]), static_cast<hsize_t>(j - i));
    i = j;
  }
  return runs;
}

// Reads the listed rows of `dataset` into `out` (`row_bytes` of memory per row, as
// `memory_type`). libhdf5 1.10 maps a selection to chunks by visiting every chunk of the
// selection's bounding box, so one selection of rows far apart in a dataset of small chunks costs
// time in proportion to the rows between them (minutes for a file that declares 2^40 rows of one
// row per chunk). Rows whose bounding box holds few chunks are read in one call; otherwise each
// run of consecutive rows is read on its own, at a cost in proportion to the rows asked for.
void read_listed_rows(hid_t dataset, hid_t memory_type, const std::vector<int64_t>& dims,
                      const std::vector<int64_t>& rows, char* out, size_t row_bytes,
                      const std::string& where) {
  const std::vector<std::pair<hsize_t, hsize_t>> runs = row_runs(dims, rows, where);
  hsize_t chunk_rows = static_cast<hsize_t>(dims[0]);
  Handle plist(H5Dget_create_plist(dataset), H5Pclose);
  MYRIAD_CHECK_HDF5(plist.get(), "reading the layout of " + where);
  if (H5Pget_layout(plist.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(dims.size());
    MYRIAD_CHECK_HDF5(H5Pget_chunk(plist.get(), static_cast<int>(chunk.size()), chunk.data()),
                      "reading the chunks of " + where);
    chunk_rows = std::max<hsize_t>(chunk[0], 1);
  }
  const hsize_t first = runs.front().first, last = runs.back().first + runs.back().second - 1;
  const bool one_read = last / chunk_rows - first / chunk_rows < 64 * runs.size();
  std::vector<hsize_t> start(dims.size(), 0), extent(dims.begin(), dims.end());
  Handle file_space(H5Dget_space(dataset), H5Sclose);
  MYRIAD_CHECK_HDF5(file_space.get(), "reading the shape of " + where);
  const auto read = [&](hsize_t rows_read, char* into) {
    extent[0] = rows_read;
    Handle memory_space(H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr),
                        H5Sclose);
    MYRIAD_CHECK_HDF5(
        H5Dread(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, into),
        "reading " + where);
  };
  if (one_read) {
    MYRIAD_CHECK_HDF5(H5Sselect_none(file_space.get()), "selecting rows of " + where);
    for (const auto& [row, count] : runs) {
      start[0] = row;
      extent[0] = count;
      MYRIAD_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_OR, start.data(), nullptr,
                                            extent.data(), nullptr),
                        "selecting rows of " + where);
    }
    read(rows.size(), out);
    return;
  }
  size_t done = 0;
  for (const auto& [row, count] : runs) {
    start[0] = row;
    extent[0] = count;
    MYRIAD_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                          extent.data(), nullptr),
                      "selecting rows of " + where);
    read(count, out + done * row_bytes);
    done += count;
  }
}

}  // namespace

torch::Tensor Hdf5File::read_row_list(const std::string& name,
                                      const std::vector<int64_t>& rows) const {
  auto lock = hdf5_lock();
  const std::vector<int64_t> dims = shape(name);
  MYRIAD_CHECK(!dims.empty(), "{} is a scalar", where(name));
  const torch::ScalarType type = dtype(name);
  std::vector<int64_t> out_shape = dims;
  out_shape[0] = static_cast<int64_t>(rows.size());
  const int64_t bytes =
      checked_bytes(out_shape, static_cast<int64_t>(torch::elementSize(type)), where(name));
  if (bytes == 0) return torch::empty(out_shape, type);
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  check_stored(dataset.get(), bytes, where(name));
  torch::Tensor out = torch::empty(out_shape, type);
  read_listed_rows(dataset.get(), native_type(type), dims, rows, static_cast<char*>(out.data_ptr()),
                   static_cast<size_t>(bytes) / rows.size(), where(name));
  return out;
}

void Hdf5File::create(const std::string& name, torch::ScalarType dtype,
                      const std::vector<int64_t>& shape, int64_t chunk_rows) {
  create_dataset(name, dtype, shape, [&](hid_t properties, const std::vector<hsize_t>& dims) {
    if (chunk_rows <= 0 || dims.empty() || dims[0] == 0) return;
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min<hsize_t>(chunk[0], static_cast<hsize_t>(chunk_rows));
    for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);
    MYRIAD_CHECK_HDF5(H5Pset_chunk(properties, static_cast<int>(chunk.size()), chunk.data()),
                      "chunking " + where(name));
  });
}

int64_t Hdf5File::allocate(const std::string& name, torch::ScalarType dtype,
                           const std::vector<int64_t>& shape) {
  return create_dataset(name, dtype, shape, [&](hid_t properties, const std::vector<hsize_t>&) {
    MYRIAD_CHECK_HDF5(H5Pset_layout(properties, H5D_CONTIGUOUS), "laying out " + where(name));
    MYRIAD_CHECK_HDF5(H5Pset_alloc_time(properties, H5D_ALLOC_TIME_EARLY),
                      "allocating " + where(name));
    MYRIAD_CHECK_HDF5(H5Pset_fill_time(properties, H5D_FILL_TIME_NEVER),
                      "allocating " + where(name));
  });
}

int64_t Hdf5File::create_dataset(
    const std::string& name, torch::ScalarType dtype, const std::vector<int64_t>& shape,
    const std::function<void(hid_t, const std::vector<hsize_t>&)>& configure) {
  auto lock = hdf5_lock();
  const std::vector<hsize_t> dims = dims_of(shape);
  Handle space(dims.empty() ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  MYRIAD_CHECK_HDF5(space.get(), "describing " + where(name));
  Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  configure(properties.get(), dims);
  // Intermediate groups ("shards/0/weight") are created as needed.
  Handle links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(links.get(), 1);
  Handle dataset(H5Dcreate2(file_, name.c_str(), native_type(dtype), space.get(), links.get(),
                            properties.get(), H5P_DEFAULT),
                 H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "creating " + where(name));
  const haddr_t offset = H5Dget_offset(dataset.get());
  return offset == HADDR_UNDEF ? -1 : static_cast<int64_t>(offset);
}

int64_t Hdf5File::contiguous_offset(const std::string& name) const {
  auto lock = hdf5_lock();
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  const haddr_t offset = H5Dget_offset(dataset.get());
  return offset == HADDR_UNDEF ? -1 : static_cast<int64_t>(offset);
}

void Hdf5File::write(const std::string& name, const torch::Tensor& tensor, int64_t chunk_rows) {
  const torch::Tensor data = storable(tensor);
  create(name, data.scalar_type(), data.sizes().vec(), chunk_rows);
  if (data.dim() == 0) {
    auto lock = hdf5_lock();
    Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
    MYRIAD_CHECK_HDF5(H5Dwrite(dataset.get(), native_type(data.scalar_type()), H5S_ALL, H5S_ALL,
                               H5P_DEFAULT, data.data_ptr()),
                      "writing " + where(name));
    return;
  }
  write_rows(name, 0, data);
}

void Hdf5File::write_rows(const std::string& name, int64_t begin, const torch::Tensor& rows) {
  auto lock = hdf5_lock();
  const torch::Tensor data = storable(rows);
  if (data.numel() == 0) return;
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
  std::vector<hsize_t> extent = dims_of(data.sizes().vec());
  std::vector<hsize_t> start(extent.size(), 0);
  start[0] = static_cast<hsize_t>(begin);
  MYRIAD_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                        extent.data(), nullptr),
                    "selecting rows of " + where(name));
  Handle memory_space(H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr),
                      H5Sclose);
  MYRIAD_CHECK_HDF5(H5Dwrite(dataset.get(), native_type(data.scalar_type()), memory_space.get(),
                             file_space.get(), H5P_DEFAULT, data.data_ptr()),
                    "writing " + where(name));
}

void Hdf5File::create_bytes(const std::string& name, int64_t count, int64_t chunk_rows) {
  auto lock = hdf5_lock();
  const hsize_t dims[1] = {static_cast<hsize_t>(count)};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Handle type(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
  Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (count > 0) {
    const hsize_t chunk[1] = {
        static_cast<hsize_t>(std::max<int64_t>(1, std::min(count, chunk_rows)))};
    MYRIAD_CHECK_HDF5(H5Pset_chunk(properties.get(), 1, chunk), "chunking " + where(name));
  }
  Handle links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(links.get(), 1);
  Handle dataset(H5Dcreate2(file_, name.c_str(), type.get(), space.get(), links.get(),
                            properties.get(), H5P_DEFAULT),
                 H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "creating " + where(name));
}

void Hdf5File::write_bytes(const std::string& name, int64_t begin,
                           const std::vector<std::string>& items) {
  auto lock = hdf5_lock();
  if (items.empty()) return;
  std::vector<hvl_t> buffers(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    buffers[i].len = items[i].size();
    buffers[i].p = const_cast<char*>(items[i].data());
  }
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle type(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
  Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
  const hsize_t start[1] = {static_cast<hsize_t>(begin)}, extent[1] = {items.size()};
  MYRIAD_CHECK_HDF5(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, extent, nullptr),
      "selecting rows of " + where(name));
  Handle memory_space(H5Screate_simple(1, extent, nullptr), H5Sclose);
  MYRIAD_CHECK_HDF5(H5Dwrite(dataset.get(), type.get(), memory_space.get(), file_space.get(),
                             H5P_DEFAULT, buffers.data()),
                    "writing " + where(name));
}

std::vector<std::string> Hdf5File::read_bytes(const std::string& name, int64_t begin,
                                              int64_t count) const {
  auto lock = hdf5_lock();
  const std::vector<int64_t> dims = shape(name);
  MYRIAD_CHECK(dims.size() == 1 && begin >= 0 && count >= 0 && begin + count <= dims[0],
               "rows [{}, {}) are outside {}", begin, begin + count, where(name));
  std::vector<std::string> items(count);
  if (count == 0) return items;
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle type(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
  Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
  const hsize_t start[1] = {static_cast<hsize_t>(begin)}, extent[1] = {static_cast<hsize_t>(count)};
  MYRIAD_CHECK_HDF5(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, extent, nullptr),
      "selecting rows of " + where(name));
  Handle memory_space(H5Screate_simple(1, extent, nullptr), H5Sclose);
  std::vector<hvl_t> buffers(count);
  MYRIAD_CHECK_HDF5(H5Dread(dataset.get(), type.get(), memory_space.get(), file_space.get(),
                            H5P_DEFAULT, buffers.data()),
                    "reading " + where(name));
  for (int64_t i = 0; i < count; ++i)
    items[i].assign(static_cast<const char*>(buffers[i].p), buffers[i].len);
  H5Dvlen_reclaim(type.get(), memory_space.get(), H5P_DEFAULT, buffers.data());
  return items;
}

std::vector<std::string> Hdf5File::read_bytes_list(const std::string& name,
                                                   const std::vector<int64_t>& rows) const {
  auto lock = hdf5_lock();
  const std::vector<int64_t> dims = shape(name);
  MYRIAD_CHECK(dims.size() == 1, "{} is not a list of byte strings", where(name));
  std::vector<std::string> items(rows.size());
  if (rows.empty()) return items;
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  MYRIAD_CHECK_HDF5(dataset.get(), "opening " + where(name));
  Handle type(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
  std::vector<hvl_t> buffers(rows.size(), hvl_t{0, nullptr});
  const hsize_t extent[1] = {rows.size()};
  Handle memory_space(H5Screate_simple(1, extent, nullptr), H5Sclose);
  // What libhdf5 allocated is freed however the reads end (rows may take several reads).
  const auto reclaim = [&] {
    H5Dvlen_reclaim(type.get(), memory_space.get(), H5P_DEFAULT, buffers.data());
  };
  try {
    read_listed_rows(dataset.get(), type.get(), dims, rows, reinterpret_cast<char*>(buffers.data()),
                     sizeof(hvl_t), where(name));
  } catch (...) {
    reclaim();
    throw;
  }
  for (size_t i = 0; i < rows.size(); ++i)
    items[i].assign(static_cast<const char*>(buffers[i].p), buffers[i].len);
  reclaim();
  return items;
}

bool Hdf5File::is_bytes(const std::string& name) const {
  auto lock = hdf5_lock();
  if (!has(name)) return false;
  Handle dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  return H5Tget_class(type.get()) == H5T_VLEN;
}

namespace {

// Replaces attribute `key` of `object` with a scalar of `type` holding `value`.
void put_attribute(hid_t file, const std::string& object, const std::string& key, hid_t type,
                   const void* value, const std::string& where) {
  Handle target(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose);
  MYRIAD_CHECK_HDF5(target.get(), "opening " + where);
  if (H5Aexists(target.get(), key.c_str()) > 0) {
    MYRIAD_CHECK_HDF5(H5Adelete(target.get(), key.c_str()),
                      "replacing attribute " + key + " of " + where);
  }
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(
      H5Acreate2(target.get(), key.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  MYRIAD_CHECK_HDF5(attribute.get(), "creating attribute " + key + " of " + where);
  MYRIAD_CHECK_HDF5(H5Awrite(attribute.get(), type, value),
                    "writing attribute " + key + " of " + where);
}

}  // namespace

void Hdf5File::set_attribute(const std::string& object, const std::string& key, int64_t value) {
  auto lock = hdf5_lock();
  put_attribute(file_, object, key, H5T_NATIVE_INT64, &value, where(object));
}

void Hdf5File::set_attribute(const std::string& object, const std::string& key, double value) {
  auto lock = hdf5_lock();
  put_attribute(file_, object, key, H5T_NATIVE_DOUBLE, &value, where(object));
}

void Hdf5File::set_attribute(const std::string& object, const std::string& key,
                             const std::string& value) {
  auto lock = hdf5_lock();
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  std::string padded = value;
  padded.resize(std::max<size_t>(1, value.size()), '\0');
  put_attribute(file_, object, key, type.get(), padded.data(), where(object));
}

namespace {

// Opens attribute `key` of `object`, or returns an invalid handle when either is absent.
hid_t open_attribute(hid_t file, const std::string& object, const std::string& key) {
  if (object != "/" && H5Lexists(file, object.c_str(), H5P_DEFAULT) <= 0) return -1;
  Handle target(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose);
  if (target.get() < 0 || H5Aexists(target.get(), key.c_str()) <= 0) return -1;
  return H5Aopen(target.get(), key.c_str(), H5P_DEFAULT);
}

}  // namespace

namespace {

template <class T>
std::optional<T> numeric_attribute(hid_t file, const std::string& object, const std::string& key,
                                   hid_t type, const std::string& where) {
  Handle attribute(open_attribute(file, object, key), H5Aclose);
  if (attribute.get() < 0) return std::nullopt;
  T value{};
  MYRIAD_CHECK_HDF5(H5Aread(attribute.get(), type, &value),
                    "reading attribute " + key + " of " + where);
  return value;
}

}  // namespace

std::optional<int64_t> Hdf5File::int_attribute(const std::string& object,
                                               const std::string& key) const {
  auto lock = hdf5_lock();
  return numeric_attribute<int64_t>(file_, object, key, H5T_NATIVE_INT64, where(object));
}

std::optional<double> Hdf5File::float_attribute(const std::string& object,
                                                const std::string& key) const {
  auto lock = hdf5_lock();
  return numeric_attribute<double>(file_, object, key, H5T_NATIVE_DOUBLE, where(object));
}

std::optional<std::string> Hdf5File::string_attribute(const std::string& object,
                                                      const std::string& key) const {
  auto lock = hdf5_lock();
  Handle attribute(open_attribute(file_, object, key), H5Aclose);
  if (attribute.get() < 0) return std::nullopt;
  Handle type(H5Aget_type(attribute.get()), H5Tclose);
  MYRIAD_CHECK(H5Tget_class(type.get()) == H5T_STRING, "attribute {} of {} is not a string", key,
               where(object));
  if (H5Tis_variable_str(type.get()) > 0) {
    char* text = nullptr;
    Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.get(), H5T_VARIABLE);
    // HDF5 converts no string between character sets: h5py writes UTF-8, H5T_C_S1 is ASCII.
    H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
    MYRIAD_CHECK_HDF5(H5Aread(attribute.get(), memory.get(), &text),
                      "reading attribute " + key + " of " + where(object));
    std::string value = text != nullptr ? text : "";
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type.get()), '\0');
  MYRIAD_CHECK_HDF5(H5Aread(attribute.get(), type.get(), value.data()),
                    "reading attribute " + key + " of " + where(object));
  value.resize(std::strlen(value.c_str()));
  return value;
}

void Hdf5File::flush() {
  auto lock = hdf5_lock();
  MYRIAD_CHECK_HDF5(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flushing " + path_);
}

}  // namespace myriad
