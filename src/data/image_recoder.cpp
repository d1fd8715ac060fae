#include "myriad/data/image_recoder.h"

#include <algorithm>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

constexpr int64_t kBlockBytes = int64_t{256} << 20;

}  // namespace

ImageEncoding parse_image_encoding(const std::string& text) {
  if (text == "jpeg") return ImageEncoding::kJpeg;
  if (text == "raw") return ImageEncoding::kRaw;
  throw UsageError(str_format("--encoding must be jpeg or raw, got '{}'", text));
}

ImageRecoder::ImageRecoder(const RecodeOptions& options) : options_(options) {
  MYRIAD_CHECK(!(options.resize && options.align), "an image is either resized or aligned");
  MYRIAD_CHECK(options.channels == 1 || options.channels == 3,
               "images decode to 1 or 3 channels, not {}", options.channels);
  MYRIAD_CHECK(options.jpeg_quality >= 1 && options.jpeg_quality <= 100,
               "the JPEG quality must be in 1..100, not {}", options.jpeg_quality);
}

ImageShape ImageRecoder::stored_shape(const ImageShape& source) const {
  if (options_.align) return {kAlignedSide, kAlignedSide, options_.channels};
  if (options_.resize) return {options_.resize->height, options_.resize->width, options_.channels};
  return {source.height, source.width, options_.channels};
}

std::string ImageRecoder::describe() const {
  if (!decodes()) return "bytes kept as they are";
  const std::string stored = options_.encoding == ImageEncoding::kRaw
                                 ? std::string("raw pixels")
                                 : str_format("JPEG quality {}", options_.jpeg_quality);
  if (options_.align) {
    return str_format("aligned to {}x{} (ArcFace template), {}", kAlignedSide, kAlignedSide,
                      stored);
  }
  return str_format("resized to {}x{} ({}), {}", options_.resize->height, options_.resize->width,
                    options_.resize->mode == ResizeMode::kCrop ? "crop" : "stretch", stored);
}

int64_t ImageRecoder::block_images(int64_t most) const {
  if (!decodes()) return most;
  const ImageShape shape = stored_shape({});
  const int64_t image_bytes = static_cast<int64_t>(shape.height) * shape.width * shape.channels;
  return std::clamp<int64_t>(kBlockBytes / image_bytes, 1, most);
}

std::string ImageRecoder::recode(std::string bytes, const ImageShape& header,
                                 const std::array<Point, 5>* landmarks,
                                 const std::string& what) const {
  if (!decodes()) return bytes;
  const int c = options_.channels;
  std::vector<uint8_t> source(static_cast<size_t>(header.height) * header.width * c);
  decode_image(bytes, header.height, header.width, c, source.data(), what);
  const ImageView view{source.data(), header.height, header.width, c};
  const ImageShape shape = stored_shape(header);
  std::string stored(static_cast<size_t>(shape.height) * shape.width * c, '\0');
  auto* pixels = reinterpret_cast<uint8_t*>(stored.data());
  if (options_.align) {
    MYRIAD_CHECK(landmarks != nullptr, "{}: no landmarks to align it by", what);
    align_face(view, *landmarks, pixels);
  } else {
    resize_image(view, *options_.resize, pixels);
  }
  if (raw()) return stored;
  return encode_jpeg(pixels, shape.height, shape.width, c, options_.jpeg_quality);
}

void ImageRecoder::write(Hdf5ImageWriter& writer, int64_t begin,
                         const std::vector<std::string>& images) const {
  if (!raw()) {
    writer.write_encoded(begin, images);
    return;
  }
  std::string pixels;
  pixels.reserve(images.empty() ? 0 : images.size() * images[0].size());
  for (const std::string& image : images) pixels += image;
  writer.write_raw(begin, reinterpret_cast<const uint8_t*>(pixels.data()),
                   static_cast<int64_t>(images.size()));
}

}  // namespace myriad
