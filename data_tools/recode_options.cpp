#include "recode_options.h"

#include "myriad/util/error.h"

namespace myriad {

void add_recode_options(po::options_description& options, RecodeText& text) {
  // clang-format off
  options.add_options()
      ("resize", po::value(&text.resize), "HxW (e.g. 112x112): decode every image, of any size, and resize it to this with an antialiased filter; stored again (--encoding)")
      ("resize-mode", po::value(&text.resize_mode)->default_value(text.resize_mode), "crop: the shorter side scaled to fit, the middle cut out (no distortion); stretch: both sides scaled")
      ("encoding", po::value(&text.encoding)->default_value(text.encoding), "how images that were decoded are stored: jpeg, or raw uint8 [N, H, W, C] pixels")
      ("jpeg-quality", po::value(&text.jpeg_quality)->default_value(text.jpeg_quality), "JPEG quality (1-100) of images stored again with --encoding jpeg");
  // clang-format on
}

RecodeOptions parse_recode_options(const po::variables_map& values, const RecodeText& text,
                                   bool align, int channels) {
  RecodeOptions o;
  o.align = align;
  o.channels = channels;
  if (values.count("resize") > 0) {
    if (align) {
      throw UsageError(
          str_format("--landmarks and --resize exclude each other: aligned faces are {}x{}",
                     kAlignedSide, kAlignedSide));
    }
    o.resize = parse_resize(text.resize, "--resize");
    o.resize->mode = parse_resize_mode(text.resize_mode);
  }
  if (option_given(values, "resize-mode") && !o.resize)
    throw UsageError("--resize-mode needs --resize");
  for (const char* name : {"encoding", "jpeg-quality"}) {
    if (option_given(values, name) && !o.resize && !align) {
      throw UsageError(str_format(
          "--{} needs --resize (or from-folder's --landmarks): without them the images' bytes are "
          "stored as they are",
          name));
    }
  }
  o.encoding = parse_image_encoding(text.encoding);
  if (option_given(values, "jpeg-quality") && o.encoding == ImageEncoding::kRaw)
    throw UsageError("--jpeg-quality does not apply to --encoding raw");
  if (text.jpeg_quality < 1 || text.jpeg_quality > 100)
    throw UsageError(str_format("--jpeg-quality must be in 1..100, got {}", text.jpeg_quality));
  o.jpeg_quality = text.jpeg_quality;
  return o;
}

}  // namespace myriad
