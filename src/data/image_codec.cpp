#include "myriad/data/image_codec.h"

#include <png.h>
#include <turbojpeg.h>

#include <memory>

#include "myriad/util/error.h"

namespace myriad {

namespace {

// A TurboJPEG handle per thread: creating one costs more than decoding a small image.
tjhandle decompressor() {
  thread_local std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
  MYRIAD_CHECK(handle != nullptr, "cannot create a TurboJPEG decompressor: {}",
               tjGetErrorStr2(nullptr));
  return handle.get();
}

ImageShape checked(const ImageShape& shape, const char* format, const std::string& what) {
  MYRIAD_CHECK(shape.height > 0 && shape.width > 0 && shape.height <= kMaxImageSide &&
                   shape.width <= kMaxImageSide,
               "{}: a {} of {}x{} pixels is outside what myriad decodes (1 to {} per side)", what,
               format, shape.height, shape.width, kMaxImageSide);
  return shape;
}

ImageShape jpeg_header(const std::string& bytes, const std::string& what) {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(decompressor(), reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<unsigned long>(bytes.size()), &width, &height, &subsampling,
                          &colorspace) != 0) {
    MYRIAD_THROW("{}: corrupt or truncated JPEG: {}", what, tjGetErrorStr2(decompressor()));
  }
  return checked({height, width, colorspace == TJCS_GRAY ? 1 : 3}, "JPEG", what);
}

struct PngImage {
  png_image image{};
  PngImage() { image.version = PNG_IMAGE_VERSION; }
  ~PngImage() { png_image_free(&image); }
};

ImageShape png_header(PngImage& png, const std::string& bytes, const std::string& what) {
  if (png_image_begin_read_from_memory(&png.image, bytes.data(), bytes.size()) == 0) {
    MYRIAD_THROW("{}: corrupt or truncated PNG: {}", what, png.image.message);
  }
  const bool colour = (png.image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  MYRIAD_CHECK(png.image.height <= kMaxImageSide && png.image.width <= kMaxImageSide,
               "{}: a PNG of {}x{} pixels is larger than myriad decodes ({} per side)", what,
               png.image.height, png.image.width, kMaxImageSide);
  return checked(
      {static_cast<int>(png.image.height), static_cast<int>(png.image.width), colour ? 3 : 1},
      "PNG", what);
}

}  // namespace

ImageFormat sniff_image_format(const std::string& bytes) {
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
      static_cast<unsigned char>(bytes[1]) == 0xD8 &&
      static_cast<unsigned char>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  static const char kPngMagic[] = "\x89PNG\r\n\x1a\n";
  if (bytes.size() >= 8 && bytes.compare(0, 8, kPngMagic, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageShape decode_image_header(const std::string& bytes, const std::string& what) {
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kJpeg:
      return jpeg_header(bytes, what);
    case ImageFormat::kPng: {
      PngImage png;
      return png_header(png, bytes, what);
    }
    default:
      MYRIAD_THROW("{}: not a JPEG or PNG image ({} bytes)", what, bytes.size());
  }
}

void decode_image(const std::string& bytes, int height, int width, int channels, uint8_t* out,
                  const std::string& what) {
  MYRIAD_CHECK(channels == 1 || channels == 3, "{}: images decode to 1 or 3 channels, not {}", what,
               channels);
  const ImageFormat format = sniff_image_format(bytes);
  if (format == ImageFormat::kJpeg) {
    const ImageShape shape = jpeg_header(bytes, what);
    MYRIAD_CHECK(shape.height == height && shape.width == width,
                 "{}: image is {}x{}, the dataset's are {}x{}", what, shape.height, shape.width,
                 height, width);
    if (tjDecompress2(decompressor(), reinterpret_cast<const unsigned char*>(bytes.data()),
                      static_cast<unsigned long>(bytes.size()), out, width, 0, height,
                      channels == 1 ? TJPF_GRAY : TJPF_RGB, 0) != 0) {
      MYRIAD_THROW("{}: corrupt or truncated JPEG: {}", what, tjGetErrorStr2(decompressor()));
    }
    return;
  }
  MYRIAD_CHECK(format == ImageFormat::kPng, "{}: not a JPEG or PNG image ({} bytes)", what,
               bytes.size());
  PngImage png;
  const ImageShape shape = png_header(png, bytes, what);
  MYRIAD_CHECK(shape.height == height && shape.width == width,
               "{}: image is {}x{}, the dataset's are {}x{}", what, shape.height, shape.width,
               height, width);
  png.image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (png_image_finish_read(&png.image, nullptr, out, 0, nullptr) == 0) {
    MYRIAD_THROW("{}: corrupt or truncated PNG: {}", what, png.image.message);
  }
}

std::string encode_jpeg(const uint8_t* pixels, int height, int width, int channels, int quality) {
  std::unique_ptr<void, int (*)(tjhandle)> compressor(tjInitCompress(), tjDestroy);
  MYRIAD_CHECK(compressor != nullptr, "cannot create a TurboJPEG compressor");
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int format = channels == 1 ? TJPF_GRAY : TJPF_RGB;
  const int subsampling = channels == 1 ? TJSAMP_GRAY : TJSAMP_444;
  if (tjCompress2(compressor.get(), pixels, width, 0, height, format, &buffer, &size, subsampling,
                  quality, 0) != 0) {
    MYRIAD_THROW("JPEG encoding failed: {}", tjGetErrorStr2(compressor.get()));
  }
  std::string bytes(reinterpret_cast<const char*>(buffer), size);
  tjFree(buffer);
  return bytes;
}

}  // namespace myriad
