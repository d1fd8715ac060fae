#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// CRC-32 (zlib's polynomial) of a file, read in blocks by several threads whose results are
// combined: checkpoint shards are gigabytes, and one thread reads far below disk speed.
uint32_t file_crc32(const std::string& path, int threads = 8,
                    int64_t block_bytes = int64_t{64} << 20);

// CRC-32 of `bytes` bytes in memory.
uint32_t crc32_of(const void* data, int64_t bytes);

// A byte range of a file and its CRC-32, computed when it was written.
struct CrcRange {
  int64_t offset = 0;
  int64_t bytes = 0;
  uint32_t crc = 0;
};

// The CRC-32 of a whole file from those of some of its ranges (they must not overlap): only the
// bytes between them are read (a checkpoint file's HDF5 metadata), so a file need not be read back
// after it was written.
uint32_t file_crc32(const std::string& path, std::vector<CrcRange> ranges);

// "1a2b3c4d"
std::string crc32_hex(uint32_t crc);

}  // namespace myriad
