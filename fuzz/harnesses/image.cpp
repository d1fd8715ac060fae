// JPEG and PNG through myriad's wrapper: the header, then a decode into a buffer of the size the
// header gave (capped by kMaxImageSide before anything is allocated), to grey and to RGB.

#include <vector>

#include "fuzz_input.h"
#include "myriad/data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ImageShape shape;
  try {
    shape = decode_image_header(bytes, "image");
  } catch (const Error&) {
    return 0;
  }
  // Real decodes of huge images take seconds; the fuzzer's timeout would report them.
  if (static_cast<int64_t>(shape.height) * shape.width > (int64_t{1} << 22)) return 0;
  for (const int channels : {1, 3}) {
    std::vector<uint8_t> pixels(static_cast<size_t>(shape.height) * shape.width * channels);
    fuzz::expect_clean(
        [&] { decode_image(bytes, shape.height, shape.width, channels, pixels.data(), "image"); });
  }
  // A decode into the wrong size must be refused, not overrun.
  std::vector<uint8_t> small(3);
  fuzz::expect_clean([&] { decode_image(bytes, 1, 1, 3, small.data(), "image"); });
  return 0;
}
