#include "fuzz_input.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "myriad/util/error.h"
#include "myriad/util/remove_tree.h"

namespace myriad::fuzz {

uint8_t FuzzInput::byte() {
  return pos_ < size_ ? data_[pos_++] : 0;
}

uint64_t FuzzInput::below(uint64_t n) {
  uint64_t v = 0;
  for (uint64_t range = n - 1; range > 0; range >>= 8) v = (v << 8) | byte();
  return v % n;
}

int64_t FuzzInput::number() {
  static constexpr int64_t kEdges[] = {0,
                                       -1,
                                       1,
                                       255,
                                       65535,
                                       std::numeric_limits<int32_t>::max(),
                                       int64_t{1} << 32,
                                       (int64_t{1} << 40) + 3,
                                       int64_t{1} << 62,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
  const uint8_t selector = byte();
  if (selector < 200) return selector % 16;
  if (selector < 240) return byte();
  if (selector < 250) return kEdges[below(sizeof(kEdges) / sizeof(kEdges[0]))];
  uint64_t raw = 0;
  for (int i = 0; i < 8; ++i) raw = (raw << 8) | byte();
  return static_cast<int64_t>(raw);
}

std::string FuzzInput::bytes(size_t n) {
  const size_t take = std::min(n, size_ - std::min(pos_, size_));
  std::string out(reinterpret_cast<const char*>(data_ + pos_), take);
  pos_ += take;
  return out;
}

std::string FuzzInput::rest() {
  return bytes(size_);
}

namespace {

// The path, allocated once and never freed, so that the removal at exit can still read it.
const std::string& scratch_root() {
  static const std::string* path = [] {
    struct stat info {};
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = stat("/dev/shm", &info) == 0 && S_ISDIR(info.st_mode) ? "/dev/shm"
                             : tmp != nullptr                                      ? tmp
                                                                                   : "/tmp";
    auto* root = new std::string(base + "/myriad-fuzz-" + std::to_string(getpid()));
    std::atexit([] { remove_tree(scratch_root()); });
    return root;
  }();
  return *path;
}

}  // namespace

std::string scratch_directory() {
  const std::string& path = scratch_root();
  const std::string failure = remove_tree(path);
  MYRIAD_CHECK(failure.empty(), "{}", failure);
  MYRIAD_CHECK(mkdir(path.c_str(), 0700) == 0, "cannot create '{}'", path);
  return path;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  MYRIAD_CHECK(out.good(), "cannot write '{}'", path);
}

}  // namespace myriad::fuzz
