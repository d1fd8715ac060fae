#include "myriad/ckpt/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "myriad/util/error.h"
#include "myriad/util/file_io.h"

namespace myriad {

uint32_t file_crc32(const std::string& path, int threads, int64_t block_bytes) {
  MYRIAD_CHECK(block_bytes > 0, "file_crc32: block size {} is not positive", block_bytes);
  const int fd = open(path.c_str(), O_RDONLY);
  MYRIAD_CHECK(fd >= 0, "cannot open '{}': {}", path, std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    close(fd);
    MYRIAD_THROW("cannot stat '{}': {}", path, std::strerror(errno));
  }
  const int64_t size = info.st_size;
  const int64_t blocks = std::max<int64_t>(1, (size + block_bytes - 1) / block_bytes);
  std::vector<uLong> crcs(static_cast<size_t>(blocks), 0);
  std::vector<std::string> errors(static_cast<size_t>(blocks));
  const int64_t stride = std::min<int64_t>(std::max(1, threads), blocks);
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < stride; ++t) {
    workers.emplace_back([&, t] {
      std::vector<unsigned char> buffer(1 << 20);
      for (int64_t b = t; b < blocks; b += stride) {
        uLong crc = crc32(0L, Z_NULL, 0);
        for (int64_t at = b * block_bytes; at < std::min(size, (b + 1) * block_bytes);) {
          const size_t want = static_cast<size_t>(
              std::min<int64_t>(buffer.size(), std::min(size, (b + 1) * block_bytes) - at));
          const ssize_t got = pread(fd, buffer.data(), want, at);
          if (got <= 0) {
            errors[b] = got == 0 ? "unexpected end of file" : std::strerror(errno);
            break;
          }
          crc = crc32(crc, buffer.data(), static_cast<uInt>(got));
          at += got;
        }
        crcs[b] = crc;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  close(fd);
  uLong total = crcs[0];
  for (int64_t b = 0; b < blocks; ++b) {
    MYRIAD_CHECK(errors[b].empty(), "reading '{}': {}", path, errors[b]);
    if (b > 0)
      total = crc32_combine(total, crcs[b],
                            static_cast<z_off_t>(std::min(block_bytes, size - b * block_bytes)));
  }
  return static_cast<uint32_t>(total);
}

uint32_t crc32_of(const void* data, int64_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* at = static_cast<const Bytef*>(data);
  // zlib counts in 32 bits.
  for (int64_t done = 0; done < bytes;) {
    const auto n = static_cast<uInt>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
    crc = crc32(crc, at + done, n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

uint32_t file_crc32(const std::string& path, std::vector<CrcRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CrcRange& a, const CrcRange& b) { return a.offset < b.offset; });
  const ReadOnlyFile file(path);
  const int64_t size = file.size();
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<unsigned char> buffer(1 << 20);
  // Extends `crc` over [from, to) of the file.
  const auto read_through = [&](int64_t from, int64_t to) {
    for (; from < to;) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(buffer.size()), to - from);
      read_at(file.fd(), buffer.data(), n, from, path);
      crc = crc32(crc, buffer.data(), static_cast<uInt>(n));
      from += n;
    }
  };
  int64_t position = 0;
  for (const CrcRange& r : ranges) {
    MYRIAD_CHECK(r.offset >= position && r.offset + r.bytes <= size,
                 "'{}': bytes [{}, {}) overlap another range or lie beyond its {} bytes", path,
                 r.offset, r.offset + r.bytes, size);
    read_through(position, r.offset);
    crc = crc32_combine(crc, r.crc, static_cast<z_off_t>(r.bytes));
    position = r.offset + r.bytes;
  }
  read_through(position, size);
  return static_cast<uint32_t>(crc);
}

std::string crc32_hex(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

}  // namespace myriad
