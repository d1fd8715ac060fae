#include "myriad/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <memory>

#include "myriad/util/error.h"

namespace myriad {

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 34;
constexpr int64_t kBlockBytes = int64_t{64} << 20;

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads exactly `size` bytes or throws; gzread reads plain files too.
void read_exactly(gzFile file, void* out, size_t size, const std::string& path, const char* what) {
  size_t done = 0;
  while (done < size) {
    const int n = gzread(file, static_cast<char*>(out) + done,
                         static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30)));
    if (n < 0) {
      int code = 0;
      MYRIAD_THROW("'{}': cannot read the {}: {}", path, what, gzerror(file, &code));
    }
    MYRIAD_CHECK(n > 0, "'{}' is truncated: its {} needs {} bytes, only {} are there", path, what,
                 size, done);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  MYRIAD_CHECK(file != nullptr, "cannot open '{}'", path);
  unsigned char magic[4];
  read_exactly(file.get(), magic, 4, path, "header");
  MYRIAD_CHECK(magic[0] == 0 && magic[1] == 0,
               "'{}' is not an IDX file (magic {:02x}{:02x}{:02x}{:02x})", path, int{magic[0]},
               int{magic[1]}, int{magic[2]}, int{magic[3]});
  MYRIAD_CHECK(magic[2] == 0x08,
               "'{}': IDX element type 0x{:02x} is not supported (only unsigned bytes)", path,
               int{magic[2]});
  const int ndim = magic[3];
  MYRIAD_CHECK(ndim >= 1 && ndim <= 4, "'{}': an IDX array of {} dimensions is not supported", path,
               ndim);
  IdxArray array;
  unsigned char sizes[16];
  read_exactly(file.get(), sizes, static_cast<size_t>(4 * ndim), path, "header");
  int64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    array.dims.push_back(big_endian(sizes + 4 * d));
    MYRIAD_CHECK(array.dims.back() == 0 || total <= kMaxElements / array.dims.back(),
                 "'{}': the header claims more than {} elements", path, kMaxElements);
    total *= array.dims.back();
  }
  // The data grows as it arrives: a header that promises gigabytes in a short file fails as
  // truncated after one block, not after allocating what it promised.
  for (int64_t done = 0; done < total;) {
    const int64_t block = std::min(kBlockBytes, total - done);
    array.data.resize(static_cast<size_t>(done + block));
    read_exactly(file.get(), array.data.data() + done, static_cast<size_t>(block), path, "data");
    done += block;
  }
  char extra = 0;
  MYRIAD_CHECK(gzread(file.get(), &extra, 1) == 0,
               "'{}' is longer than its header says ({} elements)", path, total);
  return array;
}

}  // namespace myriad
