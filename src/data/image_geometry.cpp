#include "myriad/data/image_geometry.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "myriad/data/image_codec.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// OpenCV's fixed point for warpAffine: source coordinates in 1/32 of a pixel (INTER_BITS), from
// map coefficients in 1/1024 (AB_BITS). Emulating it keeps our pixels on OpenCV's grid.
constexpr int kInterBits = 5;
constexpr int kInterSteps = 1 << kInterBits;
constexpr int kAbBits = 10;
constexpr double kAbScale = 1 << kAbBits;

// Rounds to the nearest int and saturates, as OpenCV's saturate_cast<int>.
int saturate_int(double v) {
  return static_cast<int>(std::clamp(std::nearbyint(v), -2147483648.0, 2147483647.0));
}

// The taps of one output pixel along one axis: source pixels [first, first + weights.size()).
struct Taps {
  int first = 0;
  std::vector<double> weights;
};

// Pillow's and torch's antialiased bilinear taps for `out` pixels drawn from the source window
// [start, start + length) of an axis of `in` pixels.
std::vector<Taps> resample_taps(int in, double start, double length, int out) {
  const double scale = length / out;
  const double support = std::max(scale, 1.0);
  std::vector<Taps> taps(static_cast<size_t>(out));
  for (int i = 0; i < out; ++i) {
    const double centre = start + scale * (i + 0.5);
    const int first = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int last = std::min(static_cast<int>(centre + support + 0.5), in);
    Taps& t = taps[i];
    t.first = first;
    double total = 0.0;
    for (int j = first; j < last; ++j) {
      const double w = std::max(0.0, 1.0 - std::abs((j - centre + 0.5) / support));
      t.weights.push_back(w);
      total += w;
    }
    for (double& w : t.weights) w = total > 0.0 ? w / total : 0.0;
  }
  return taps;
}

// Halves round up, as the fixed-point sums of OpenCV's warpAffine and Pillow's resampling do:
// (sum + 2^(bits - 1)) >> bits. Half to even would differ from them by one on exact ties.
uint8_t to_grey_level(double v) {
  return static_cast<uint8_t>(std::clamp(std::floor(v + 0.5), 0.0, 255.0));
}

}  // namespace

Point Affine::apply(const Point& p) const {
  return {m[0] * p.x + m[1] * p.y + m[2], m[3] * p.x + m[4] * p.y + m[5]};
}

Affine Affine::inverse() const {
  const double det = m[0] * m[4] - m[1] * m[3];
  MYRIAD_CHECK(std::isfinite(det) && std::abs(det) > 1e-12, "the affine map is singular");
  const double a = m[4] / det, b = -m[1] / det, d = -m[3] / det, e = m[0] / det;
  return {{a, b, -(a * m[2] + b * m[5]), d, e, -(d * m[2] + e * m[5])}};
}

Affine estimate_similarity(const std::vector<Point>& from, const std::vector<Point>& to) {
  MYRIAD_CHECK(from.size() == to.size() && from.size() >= 2,
               "a similarity needs at least two pairs of points ({} and {} given)", from.size(),
               to.size());
  const double n = static_cast<double>(from.size());
  Point from_mean, to_mean;
  for (size_t i = 0; i < from.size(); ++i) {
    MYRIAD_CHECK(std::isfinite(from[i].x) && std::isfinite(from[i].y) && std::isfinite(to[i].x) &&
                     std::isfinite(to[i].y),
                 "point {} of a similarity is not finite", i);
    from_mean = {from_mean.x + from[i].x / n, from_mean.y + from[i].y / n};
    to_mean = {to_mean.x + to[i].x / n, to_mean.y + to[i].y / n};
  }
  // The least-squares scaled rotation [a -b; b a] of the centred points; for two dimensions it is
  // Umeyama's estimate, in closed form.
  double dot = 0.0, cross = 0.0, spread = 0.0;
  for (size_t i = 0; i < from.size(); ++i) {
    const double px = from[i].x - from_mean.x, py = from[i].y - from_mean.y;
    const double qx = to[i].x - to_mean.x, qy = to[i].y - to_mean.y;
    dot += px * qx + py * qy;
    cross += px * qy - py * qx;
    spread += px * px + py * py;
  }
  MYRIAD_CHECK(spread > 1e-12 * (1.0 + from_mean.x * from_mean.x + from_mean.y * from_mean.y),
               "the landmarks all lie on one point: no similarity maps them");
  const double a = dot / spread, b = cross / spread;
  return {{a, -b, to_mean.x - (a * from_mean.x - b * from_mean.y), b, a,
           to_mean.y - (b * from_mean.x + a * from_mean.y)}};
}

void warp_affine(const ImageView& source, const Affine& source_to_output, int height, int width,
                 uint8_t* out) {
  const Affine back = source_to_output.inverse();
  const int c = source.channels;
  const int64_t stride = static_cast<int64_t>(source.width) * c;
  const auto inside = [&](int x, int y) {
    return x >= 0 && y >= 0 && x < source.width && y < source.height;
  };
  const int round_delta = (1 << kAbBits) / kInterSteps / 2;
  for (int y = 0; y < height; ++y) {
    const int x_row = saturate_int((back.m[1] * y + back.m[2]) * kAbScale) + round_delta;
    const int y_row = saturate_int((back.m[4] * y + back.m[5]) * kAbScale) + round_delta;
    for (int x = 0; x < width; ++x) {
      const int sx = (x_row + saturate_int(back.m[0] * x * kAbScale)) >> (kAbBits - kInterBits);
      const int sy = (y_row + saturate_int(back.m[3] * x * kAbScale)) >> (kAbBits - kInterBits);
      const int x0 = sx >> kInterBits, y0 = sy >> kInterBits;
      const double fx = static_cast<double>(sx & (kInterSteps - 1)) / kInterSteps;
      const double fy = static_cast<double>(sy & (kInterSteps - 1)) / kInterSteps;
      const double w[4] = {(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy};
      const int xs[4] = {x0, x0 + 1, x0, x0 + 1};
      const int ys[4] = {y0, y0, y0 + 1, y0 + 1};
      uint8_t* pixel = out + (static_cast<int64_t>(y) * width + x) * c;
      for (int k = 0; k < c; ++k) {
        double v = 0.0;
        for (int t = 0; t < 4; ++t) {
          if (inside(xs[t], ys[t])) v += w[t] * source.pixels[ys[t] * stride + xs[t] * c + k];
        }
        pixel[k] = to_grey_level(v);
      }
    }
  }
}

Affine alignment_transform(const std::array<Point, 5>& landmarks) {
  return estimate_similarity({landmarks.begin(), landmarks.end()},
                             {kArcFaceTemplate.begin(), kArcFaceTemplate.end()});
}

void align_face(const ImageView& source, const std::array<Point, 5>& landmarks, uint8_t* out) {
  warp_affine(source, alignment_transform(landmarks), kAlignedSide, kAlignedSide, out);
}

ResizeSpec parse_resize(const std::string& text, const std::string& option) {
  ResizeSpec spec;
  const size_t x = text.find('x');
  const auto side = [&](const std::string& part) {
    // Digits only: strtol alone would take " 112" and "+112".
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](unsigned char c) {
      return std::isdigit(c);
    });
    const long v = digits ? std::strtol(part.c_str(), nullptr, 10) : 0;
    if (v < 1 || v > kMaxImageSide) {
      throw UsageError(str_format(
          "{} '{}' is not a size: give HxW, each side 1 to {} pixels (for example 112x112)", option,
          text, kMaxImageSide));
    }
    return static_cast<int>(v);
  };
  if (x == std::string::npos) side("");
  spec.height = side(text.substr(0, x));
  spec.width = side(text.substr(x + 1));
  return spec;
}

ResizeMode parse_resize_mode(const std::string& text) {
  if (text == "crop") return ResizeMode::kCrop;
  if (text == "stretch") return ResizeMode::kStretch;
  throw UsageError(str_format("--resize-mode must be crop or stretch, got '{}'", text));
}

void resize_image(const ImageView& source, const ResizeSpec& spec, uint8_t* out) {
  // The source window: all of it, or the middle part of the target's aspect ratio.
  double window_h = source.height, window_w = source.width;
  if (spec.mode == ResizeMode::kCrop) {
    const double scale = std::min(static_cast<double>(source.height) / spec.height,
                                  static_cast<double>(source.width) / spec.width);
    window_h = scale * spec.height;
    window_w = scale * spec.width;
  }
  const std::vector<Taps> across =
      resample_taps(source.width, 0.5 * (source.width - window_w), window_w, spec.width);
  const std::vector<Taps> down =
      resample_taps(source.height, 0.5 * (source.height - window_h), window_h, spec.height);
  const int c = source.channels;
  // Rows first, into float, then columns.
  std::vector<double> rows(static_cast<size_t>(source.height) * spec.width * c, 0.0);
  for (int y = 0; y < source.height; ++y) {
    const uint8_t* line = source.pixels + static_cast<int64_t>(y) * source.width * c;
    double* into = rows.data() + static_cast<int64_t>(y) * spec.width * c;
    for (int x = 0; x < spec.width; ++x) {
      const Taps& t = across[x];
      for (size_t j = 0; j < t.weights.size(); ++j) {
        for (int k = 0; k < c; ++k) into[x * c + k] += t.weights[j] * line[(t.first + j) * c + k];
      }
    }
  }
  const int64_t row_size = static_cast<int64_t>(spec.width) * c;
  for (int y = 0; y < spec.height; ++y) {
    const Taps& t = down[y];
    uint8_t* line = out + y * row_size;
    for (int64_t i = 0; i < row_size; ++i) {
      double v = 0.0;
      for (size_t j = 0; j < t.weights.size(); ++j)
        v += t.weights[j] * rows[(t.first + j) * row_size + i];
      line[i] = to_grey_level(v);
    }
  }
}

}  // namespace myriad
