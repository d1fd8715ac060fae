#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// uint8 pixels, height x width x channels (1 or 3), row after row, as the decoders write them.
struct ImageView {
  const uint8_t* pixels = nullptr;
  int height = 0;
  int width = 0;
  int channels = 0;
};

struct Point {
  double x = 0.0;
  double y = 0.0;
};

// x' = m[0] x + m[1] y + m[2], y' = m[3] x + m[4] y + m[5], with pixel centres at whole
// coordinates (OpenCV's convention, which insightface's alignment uses).
struct Affine {
  std::array<double, 6> m{1.0, 0.0, 0.0, 0.0, 1.0, 0.0};

  Point apply(const Point& p) const;
  // An Error where the map is singular.
  Affine inverse() const;
};

// The similarity (rotation, uniform scale, translation; no reflection) that maps `from` onto `to`
// with the least squared error: Umeyama's estimate, as scikit-image's
// SimilarityTransform.estimate. Fewer than two points, lists of different lengths, non-finite
// coordinates, or `from` points that all coincide are an Error.
Affine estimate_similarity(const std::vector<Point>& from, const std::vector<Point>& to);

// The image `source` seen through `source_to_output`, height x width x source.channels, into
// `out`: each output pixel is the bilinear interpolation of the source at the inverse map of its
// centre, pixels outside the source counting as 0; as OpenCV's warpAffine with INTER_LINEAR and a
// constant 0 border, rounded to the nearest grey level.
void warp_affine(const ImageView& source, const Affine& source_to_output, int height, int width,
                 uint8_t* out);

// insightface's ArcFace template: where the left eye, right eye, nose and the left and right
// corners of the mouth lie in an aligned 112x112 face.
constexpr int kAlignedSide = 112;
constexpr std::array<Point, 5> kArcFaceTemplate = {{{38.2946, 51.6963},
                                                    {73.5318, 51.5014},
                                                    {56.0252, 71.7366},
                                                    {41.5493, 92.3655},
                                                    {70.7299, 92.2041}}};

// The map from a loose crop to the aligned face that puts `landmarks` (in the order of
// kArcFaceTemplate) nearest the template.
Affine alignment_transform(const std::array<Point, 5>& landmarks);

// The aligned face, kAlignedSide x kAlignedSide x source.channels, into `out`.
void align_face(const ImageView& source, const std::array<Point, 5>& landmarks, uint8_t* out);

// How an image becomes height x width: stretched to it, or its shorter side scaled to the
// target's and the middle cut out (no distortion).
enum class ResizeMode { kStretch, kCrop };

struct ResizeSpec {
  int height = 0;
  int width = 0;
  ResizeMode mode = ResizeMode::kCrop;
};

// "HxW" ("112x112"), each side 1 to kMaxImageSide; anything else is a UsageError naming `option`.
ResizeSpec parse_resize(const std::string& text, const std::string& option);
// "crop" or "stretch"; anything else is a UsageError.
ResizeMode parse_resize_mode(const std::string& text);

// `source` resampled to spec.height x spec.width x source.channels into `out`, with a triangle
// (bilinear) filter widened by the scale when shrinking, so that every source pixel counts (the
// antialiased resampling of Pillow and of torch's interpolate(antialias=True)).
void resize_image(const ImageView& source, const ResizeSpec& spec, uint8_t* out);

}  // namespace myriad
