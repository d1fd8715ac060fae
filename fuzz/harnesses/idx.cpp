// IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed.

#include <zlib.h>

#include "fuzz_input.h"
#include "myriad/data/idx_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  fuzz::FuzzInput input(data, size);
  const bool gzip = input.flag();
  const std::string body = input.rest();
  const std::string path = fuzz::scratch_directory() + (gzip ? "/images.idx.gz" : "/images.idx");
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    if (file == nullptr) return 0;
    gzwrite(file, body.data(), static_cast<unsigned>(body.size()));
    gzclose(file);
  } else {
    fuzz::write_file(path, body);
  }
  fuzz::expect_clean([&] { read_idx(path); });
  return 0;
}
