#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace myriad::testing {

// PNG bytes of a uint8 HWC image (libpng's simplified writer).
std::string encode_png(const uint8_t* pixels, int height, int width, int channels);

// An IDX file: `dims` and uint8 `data`, gzip-compressed when `gzip`.
void write_idx(const std::string& path, const std::vector<int64_t>& dims,
               const std::vector<uint8_t>& data, bool gzip);

void write_bytes(const std::string& path, const std::string& bytes);

// `n` pseudo-random bytes, the same for the same seed.
std::string random_bytes(size_t n, uint32_t seed);

// The message of the myriad::Error `work` throws, or "" when it throws none.
std::string error_of(const std::function<void()>& work);

// A path in this process's directory under the test temporary directory (removed at exit).
std::string temp_file(const std::string& name);

}  // namespace myriad::testing
