#include "myriad/ckpt/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "myriad/util/error.h"

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

std::string crc32_hex(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

}  // namespace myriad
