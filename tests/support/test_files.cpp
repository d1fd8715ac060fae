#include "test_files.h"

#include <gtest/gtest.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

#include "myriad/util/error.h"
#include "myriad/util/remove_tree.h"

namespace myriad::testing {

std::string encode_png(const uint8_t* pixels, int height, int width, int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, nullptr) == 0) {
    throw std::runtime_error(image.message);
  }
  std::string bytes(size, '\0');
  if (png_image_write_to_memory(&image, bytes.data(), &size, 0, pixels, 0, nullptr) == 0) {
    throw std::runtime_error(image.message);
  }
  bytes.resize(size);
  return bytes;
}

void write_idx(const std::string& path, const std::vector<int64_t>& dims,
               const std::vector<uint8_t>& data, bool gzip) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (int64_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<char>((d >> shift) & 0xFF));
  }
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size());
  if (!gzip) return write_bytes(path, bytes);
  gzFile file = gzopen(path.c_str(), "wb");
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(gen() & 0xFF);
  return bytes;
}

std::string error_of(const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

namespace {

// One directory per test process, removed when the process exits, so that what the tests write
// does not pile up in the temporary directory.
const std::string& temp_directory() {
  static const std::string* path = [] {
    auto* made = new std::string(::testing::TempDir() + "/myriad_" + std::to_string(getpid()));
    MYRIAD_CHECK(mkdir(made->c_str(), 0700) == 0 || errno == EEXIST, "cannot create '{}': {}",
                 *made, std::strerror(errno));
    std::atexit([] { remove_tree(temp_directory()); });
    return made;
  }();
  return *path;
}

}  // namespace

std::string temp_file(const std::string& name) {
  return temp_directory() + "/" + name;
}

}  // namespace myriad::testing
