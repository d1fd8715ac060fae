#pragma once

#include <cstdint>
#include <string>

namespace myriad {

// CRC-32 (zlib's polynomial) of a file, read in blocks by several threads whose results are
// combined: checkpoint shards are gigabytes, and one thread reads far below disk speed.
uint32_t file_crc32(const std::string& path, int threads = 8,
                    int64_t block_bytes = int64_t{64} << 20);

// "1a2b3c4d"
std::string crc32_hex(uint32_t crc);

}  // namespace myriad
