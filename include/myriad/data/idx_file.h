#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// An array from an IDX file (the MNIST / Fashion-MNIST format): big-endian magic 0x0000TTNN with
// T = 0x08 (unsigned byte) and N dimensions, then N big-endian uint32 sizes, then the data.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads plain or gzip-compressed files. A wrong magic, an unsupported element type or a file
// shorter (or longer) than its header promises is an Error naming the file.
IdxArray read_idx(const std::string& path);

}  // namespace myriad
