#pragma once

// What the harnesses share: a reader of structure from the fuzzer's bytes, a private scratch
// directory, and the rule for outcomes (fuzz/README.md).

#include <cstddef>
#include <cstdint>
#include <string>

namespace myriad::fuzz {

// Takes decisions and values from the input, front to back; once it is used up every read gives
// zeros, so every input describes some structure.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  uint8_t byte();
  bool flag() { return (byte() & 1) != 0; }
  // In [0, n) for n > 0.
  uint64_t below(uint64_t n);
  // A size or count: mostly small, sometimes an edge value (0, -1, 2^31 - 1, 2^32, 2^62,
  // INT64_MAX, ...) or 8 raw bytes, so that checks of large and negative values run.
  int64_t number();
  // Up to `n` bytes.
  std::string bytes(size_t n);
  std::string rest();

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A directory of this process, emptied at every call and removed at exit: under /dev/shm when it
// exists, so that file-based readers run at memory speed.
std::string scratch_directory();
// Writes `bytes` to `path`.
void write_file(const std::string& path, const std::string& bytes);

// Runs `work`: returns normally when it does, or when it raises myriad's Error (a refused input is
// a result, not a finding). Any other exception escapes, and libFuzzer reports it as a crash.
template <class Work>
void expect_clean(Work&& work);

}  // namespace myriad::fuzz

#include "myriad/util/error.h"

template <class Work>
void myriad::fuzz::expect_clean(Work&& work) {
  try {
    work();
  } catch (const myriad::Error&) {
  }
}
