#pragma once

#include <cstdint>
#include <string>

namespace myriad {

enum class ImageFormat { kJpeg, kPng, kUnknown };

// From the leading magic bytes.
ImageFormat sniff_image_format(const std::string& bytes);

struct ImageShape {
  int height = 0;
  int width = 0;
  int channels = 0;  // as stored: 1 (grey) or 3 (colour; PNG alpha is dropped)
};

// The largest height or width myriad decodes: a header claiming more (a corrupt or hostile file)
// is an Error before anything is allocated for its pixels.
constexpr int kMaxImageSide = 16384;

// Reads only the header. A truncated or corrupt image, or one larger than kMaxImageSide, is an
// Error; `what` names it in messages.
ImageShape decode_image_header(const std::string& bytes, const std::string& what);

// Decodes JPEG (libjpeg-turbo) or PNG (libpng) into `out`, uint8 height x width x channels,
// converting to 1 (grey) or 3 (RGB) channels. The image must have the given height and width.
void decode_image(const std::string& bytes, int height, int width, int channels, uint8_t* out,
                  const std::string& what);

// JPEG bytes of a uint8 HWC image with 1 or 3 channels (tests and synthetic encoded data).
std::string encode_jpeg(const uint8_t* pixels, int height, int width, int channels, int quality);

}  // namespace myriad
