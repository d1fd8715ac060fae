#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "myriad/data/image_codec.h"
#include "myriad/data/image_geometry.h"

namespace myriad {

class Hdf5ImageWriter;

// How images that were decoded are stored again: JPEG bytes, or raw uint8 pixels.
enum class ImageEncoding { kJpeg, kRaw };

// "jpeg" or "raw"; anything else is a UsageError.
ImageEncoding parse_image_encoding(const std::string& text);

// What a converter (myriad-data from-folder, from-rec) does to each image.
struct RecodeOptions {
  std::optional<ResizeSpec> resize;  // decode, then resize to this
  bool align = false;  // decode, then align the face by its landmarks (kAlignedSide square)
  ImageEncoding encoding = ImageEncoding::kJpeg;
  int jpeg_quality = 95;
  int channels = 3;  // what the images decode to
};

// Without resize or alignment an image is stored as the bytes it came in (all images must then
// have one size); with either, it is decoded, resized or aligned, and stored again, so that images
// of any size make one dataset. Safe to use from several threads at once.
class ImageRecoder {
 public:
  explicit ImageRecoder(const RecodeOptions& options);

  bool decodes() const { return options_.resize.has_value() || options_.align; }
  // Whether stored images are raw pixels rather than encoded bytes.
  bool raw() const { return decodes() && options_.encoding == ImageEncoding::kRaw; }
  // The shape of every stored image: the source's own where bytes are kept.
  ImageShape stored_shape(const ImageShape& source) const;
  // For logs: "bytes kept as they are", "resized to 112x112 (crop), JPEG quality 95", ...
  std::string describe() const;
  // Images per block of a conversion: at most `most`, and fewer where decoded images are large,
  // so that a block's pixels stay within a few hundred MB.
  int64_t block_images(int64_t most) const;

  // Image `bytes`, whose header is `header`, as stored: the bytes themselves, or the image
  // decoded, resized (or aligned by `landmarks`, required then), as JPEG bytes or H x W x C
  // pixels. A corrupt image is an Error naming `what`.
  std::string recode(std::string bytes, const ImageShape& header,
                     const std::array<Point, 5>* landmarks, const std::string& what) const;
  // recode()'s results as rows [begin, begin + images.size()) of `writer`, which must have been
  // made for raw() pixels or encoded bytes.
  void write(Hdf5ImageWriter& writer, int64_t begin, const std::vector<std::string>& images) const;

 private:
  RecodeOptions options_;
};

}  // namespace myriad
