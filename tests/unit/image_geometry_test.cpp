// include/myriad/data/image_geometry.h against float64 references written here: Umeyama's
// similarity through an SVD (torch float64 linalg_svd), bilinear sampling, and the antialiased
// triangle filter summed over the whole image.

#include "myriad/data/image_geometry.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>

#include "myriad/util/error.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using myriad::testing::error_of;

constexpr double kPi = 3.14159265358979323846;

torch::Tensor as_tensor(const std::vector<Point>& points) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(points.size()), 2}, torch::kFloat64);
  for (size_t i = 0; i < points.size(); ++i) {
    t[i][0] = points[i].x;
    t[i][1] = points[i].y;
  }
  return t;
}

// Umeyama (1991), eq. 40-42, as scikit-image's _umeyama: the rotation is U diag(1, d) V^T with d
// the sign that keeps it a rotation, also where the covariance has rank 1 (collinear points).
std::array<double, 6> umeyama(const std::vector<Point>& from, const std::vector<Point>& to) {
  const torch::Tensor src = as_tensor(from), dst = as_tensor(to);
  const torch::Tensor src_mean = src.mean(0), dst_mean = dst.mean(0);
  const torch::Tensor a = (dst - dst_mean).t().mm(src - src_mean) / src.size(0);
  const auto [u, s, vh] = torch::linalg_svd(a);
  const double d = (torch::linalg_det(u) * torch::linalg_det(vh)).item<double>() > 0 ? 1.0 : -1.0;
  const torch::Tensor rotation = u.mm(torch::diag(torch::tensor({1.0, d}, torch::kFloat64))).mm(vh);
  const double variance = (src - src_mean).pow(2).sum(1).mean().item<double>();
  const double scale = (s[0].item<double>() + d * s[1].item<double>()) / variance;
  const torch::Tensor shift = dst_mean - scale * rotation.mv(src_mean);
  const auto r = rotation.accessor<double, 2>();
  return {scale * r[0][0], scale * r[0][1], shift[0].item<double>(),
          scale * r[1][0], scale * r[1][1], shift[1].item<double>()};
}

// A similarity: rotation by `degrees`, scale, then translation.
Affine similarity(double degrees, double scale, double tx, double ty) {
  const double c = scale * std::cos(degrees * kPi / 180.0),
               s = scale * std::sin(degrees * kPi / 180.0);
  return {{c, -s, tx, s, c, ty}};
}

std::vector<Point> mapped(const Affine& map, const std::vector<Point>& points) {
  std::vector<Point> out;
  for (const Point& p : points) out.push_back(map.apply(p));
  return out;
}

std::vector<Point> template_points() {
  return {kArcFaceTemplate.begin(), kArcFaceTemplate.end()};
}

void expect_same_map(const std::array<double, 6>& got, const std::array<double, 6>& want,
                     double tolerance) {
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(got[k], want[k], tolerance) << "coefficient " << k;
}

TEST(EstimateSimilarity, ExactLandmarksGiveTheirSimilarity) {
  const Affine truth = similarity(-23.0, 0.61, 14.5, -3.25);
  const std::vector<Point> from = template_points();
  const Affine estimate = estimate_similarity(from, mapped(truth, from));
  expect_same_map(estimate.m, truth.m, 1e-9);
  expect_same_map(estimate.m, umeyama(from, mapped(truth, from)), 1e-9);
}

TEST(EstimateSimilarity, NoisyLandmarksMatchUmeyama) {
  std::mt19937 random(7);
  std::normal_distribution<double> noise(0.0, 3.0);
  for (int trial = 0; trial < 20; ++trial) {
    const Affine truth = similarity(trial * 17.0 - 150.0, 0.5 + 0.1 * trial, trial, -2.0 * trial);
    std::vector<Point> from, to;
    for (const Point& p : template_points()) {
      from.push_back({p.x * 2.5 + noise(random), p.y * 2.5 + noise(random)});
      const Point q = truth.apply(from.back());
      to.push_back({q.x + noise(random), q.y + noise(random)});
    }
    expect_same_map(estimate_similarity(from, to).m, umeyama(from, to), 1e-9);
  }
}

TEST(EstimateSimilarity, ReflectedLandmarksGetTheBestRotation) {
  // A mirror image's landmarks: no similarity fits; Umeyama's rotation is the best one.
  std::vector<Point> from = template_points(), to;
  for (const Point& p : from) to.push_back({200.0 - p.x, p.y + 9.0});
  expect_same_map(estimate_similarity(from, to).m, umeyama(from, to), 1e-9);
}

TEST(EstimateSimilarity, CollinearLandmarksAreFine) {
  const std::vector<Point> from = {{0, 0}, {10, 5}, {20, 10}, {-7, -3.5}, {3, 1.5}};
  const std::vector<Point> to = template_points();
  expect_same_map(estimate_similarity(from, to).m, umeyama(from, to), 1e-9);
}

TEST(EstimateSimilarity, DegenerateInputIsAnError) {
  const std::vector<Point> same(5, Point{31.0, 47.0});
  EXPECT_NE(
      error_of([&] { estimate_similarity(same, template_points()); }).find("all lie on one point"),
      std::string::npos);
  EXPECT_FALSE(error_of([] { estimate_similarity({{1, 2}}, {{3, 4}}); }).empty());
  EXPECT_FALSE(error_of([] { estimate_similarity({{1, 2}, {3, 4}}, {{3, 4}}); }).empty());
  EXPECT_NE(error_of([] {
              estimate_similarity({{1, 2}, {NAN, 4}}, {{3, 4}, {5, 6}});
            }).find("not finite"),
            std::string::npos);
  // Landmarks that coincide give no alignment.
  std::array<Point, 5> landmarks;
  landmarks.fill({50.0, 60.0});
  EXPECT_FALSE(error_of([&] { alignment_transform(landmarks); }).empty());
}

// A smooth colour image, `height` x `width` x 3.
std::vector<uint8_t> smooth_image(int height, int width) {
  std::vector<uint8_t> pixels(static_cast<size_t>(height) * width * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        const double v = 128.0 +
                         60.0 * std::sin(0.11 * x + 0.7 * c) * std::cos(0.09 * y - 0.3 * c) +
                         40.0 * std::sin(0.05 * (x + y) + c);
        pixels[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(std::lround(v));
      }
    }
  }
  return pixels;
}

// `image` seen through `map` (image to output), float64 bilinear, 0 outside: the reference
// sampling, with no fixed point.
std::vector<double> bilinear_warp(const std::vector<uint8_t>& image, int height, int width,
                                  const Affine& map, int out_height, int out_width) {
  const Affine back = map.inverse();
  std::vector<double> out(static_cast<size_t>(out_height) * out_width * 3, 0.0);
  const auto pixel = [&](int x, int y, int c) {
    if (x < 0 || y < 0 || x >= width || y >= height) return 0.0;
    return static_cast<double>(image[(static_cast<size_t>(y) * width + x) * 3 + c]);
  };
  for (int y = 0; y < out_height; ++y) {
    for (int x = 0; x < out_width; ++x) {
      const Point p = back.apply({static_cast<double>(x), static_cast<double>(y)});
      const int x0 = static_cast<int>(std::floor(p.x)), y0 = static_cast<int>(std::floor(p.y));
      const double fx = p.x - x0, fy = p.y - y0;
      for (int c = 0; c < 3; ++c) {
        out[(static_cast<size_t>(y) * out_width + x) * 3 + c] =
            (1 - fx) * (1 - fy) * pixel(x0, y0, c) + fx * (1 - fy) * pixel(x0 + 1, y0, c) +
            (1 - fx) * fy * pixel(x0, y0 + 1, c) + fx * fy * pixel(x0 + 1, y0 + 1, c);
      }
    }
  }
  return out;
}

TEST(WarpAffine, FollowsBilinearSamplingOnOpenCvsGrid) {
  const int h = 40, w = 50, out_h = 36, out_w = 45;
  const std::vector<uint8_t> image = smooth_image(h, w);
  const Affine map = similarity(12.0, 1.3, -5.0, 7.5);
  std::vector<uint8_t> out(out_h * out_w * 3);
  warp_affine({image.data(), h, w, 3}, map, out_h, out_w, out.data());
  const std::vector<double> want = bilinear_warp(image, h, w, map, out_h, out_w);
  // Coordinates on a 1/32-pixel grid move a sample by at most 1/64 pixel: a fraction of a grey
  // level inside the image, up to 4 where the image falls to the 0 around it.
  int64_t inside = 0, outside = 0;
  for (int y = 0; y < out_h; ++y) {
    for (int x = 0; x < out_w; ++x) {
      const Point p = map.inverse().apply({static_cast<double>(x), static_cast<double>(y)});
      const bool interior = p.x > 0.1 && p.y > 0.1 && p.x < w - 1.1 && p.y < h - 1.1;
      const bool exterior = p.x < -1.1 || p.y < -1.1 || p.x > w + 0.1 || p.y > h + 0.1;
      inside += interior ? 1 : 0;
      outside += exterior ? 1 : 0;
      for (int c = 0; c < 3; ++c) {
        const size_t i = (static_cast<size_t>(y) * out_w + x) * 3 + c;
        ASSERT_NEAR(out[i], want[i], interior ? 0.9 : 4.5) << x << "," << y << " channel " << c;
        if (exterior) {
          ASSERT_EQ(out[i], 0);
        }
      }
    }
  }
  // The map takes the output over the image's edges: both cases occur.
  EXPECT_GT(inside, 500);
  EXPECT_GT(outside, 50);
}

TEST(AlignFace, RecoversTheSimilarityThatPlacedTheFace) {
  const std::vector<uint8_t> face = smooth_image(kAlignedSide, kAlignedSide);
  // The face placed into a larger loose crop: turned, enlarged and moved, wholly inside it.
  const Affine placement = similarity(17.0, 1.35, 60.0, 25.0);
  const int crop_h = 200, crop_w = 230;
  const std::vector<double> placed =
      bilinear_warp(face, kAlignedSide, kAlignedSide, placement, crop_h, crop_w);
  std::vector<uint8_t> crop(placed.size());
  for (size_t i = 0; i < placed.size(); ++i) crop[i] = static_cast<uint8_t>(std::lround(placed[i]));
  std::array<Point, 5> landmarks;
  for (int k = 0; k < 5; ++k) landmarks[k] = placement.apply(kArcFaceTemplate[k]);

  expect_same_map(alignment_transform(landmarks).m, placement.inverse().m, 1e-9);
  std::vector<uint8_t> aligned(face.size());
  align_face({crop.data(), crop_h, crop_w, 3}, landmarks, aligned.data());
  // Two bilinear resamplings of a smooth image (each rounded to a grey level) and the pattern's
  // noise: within 2 grey levels on average, as tests/unit/ijb_test.cpp holds synthetic-ijb's faces;
  // the outermost pixels sample the face's edge.
  double total = 0.0;
  int64_t count = 0;
  for (int y = 2; y < kAlignedSide - 2; ++y) {
    for (int x = 2; x < kAlignedSide - 2; ++x) {
      for (int c = 0; c < 3; ++c) {
        const size_t i = (static_cast<size_t>(y) * kAlignedSide + x) * 3 + c;
        total += std::abs(static_cast<double>(aligned[i]) - face[i]);
        ++count;
      }
    }
  }
  EXPECT_LT(total / count, 2.0);
  // The control: the crop itself, unaligned, is far from the face.
  double unaligned = 0.0;
  for (size_t i = 0; i < face.size(); ++i) {
    const int y = static_cast<int>(i / (kAlignedSide * 3)),
              rest = static_cast<int>(i % (kAlignedSide * 3));
    unaligned += std::abs(static_cast<double>(crop[y * crop_w * 3 + rest]) - face[i]);
  }
  EXPECT_GT(unaligned / face.size(), 10.0);
}

// The antialiased triangle filter as Pillow and torch define it, summed over every source pixel
// of the axis: output pixel i of `out` takes source pixel j with weight
// max(0, 1 - |j + 0.5 - centre| / support), centre = start + scale (i + 0.5), support =
// max(scale, 1), normalised.
std::vector<std::vector<double>> reference_weights(int in, double start, double length, int out) {
  const double scale = length / out, support = std::max(scale, 1.0);
  std::vector<std::vector<double>> weights(out, std::vector<double>(in, 0.0));
  for (int i = 0; i < out; ++i) {
    const double centre = start + scale * (i + 0.5);
    double total = 0.0;
    for (int j = 0; j < in; ++j) {
      weights[i][j] = std::max(0.0, 1.0 - std::abs(j + 0.5 - centre) / support);
      total += weights[i][j];
    }
    for (double& w : weights[i]) w /= total;
  }
  return weights;
}

std::vector<double> reference_resize(const std::vector<uint8_t>& image, int height, int width,
                                     int channels, const ResizeSpec& spec) {
  double window_h = height, window_w = width;
  if (spec.mode == ResizeMode::kCrop) {
    // The shorter side scaled to the target's, the middle cut out.
    const double scale = std::min(static_cast<double>(height) / spec.height,
                                  static_cast<double>(width) / spec.width);
    window_h = scale * spec.height;
    window_w = scale * spec.width;
  }
  const auto down = reference_weights(height, (height - window_h) / 2, window_h, spec.height);
  const auto across = reference_weights(width, (width - window_w) / 2, window_w, spec.width);
  std::vector<double> out(static_cast<size_t>(spec.height) * spec.width * channels, 0.0);
  for (int y = 0; y < spec.height; ++y) {
    for (int x = 0; x < spec.width; ++x) {
      for (int c = 0; c < channels; ++c) {
        double v = 0.0;
        for (int i = 0; i < height; ++i) {
          for (int j = 0; j < width; ++j)
            v += down[y][i] * across[x][j] *
                 image[(static_cast<size_t>(i) * width + j) * channels + c];
        }
        out[(static_cast<size_t>(y) * spec.width + x) * channels + c] = v;
      }
    }
  }
  return out;
}

TEST(ResizeImage, MatchesTheAntialiasedTriangleFilter) {
  std::mt19937 random(3);
  std::uniform_int_distribution<int> level(0, 255);
  struct Case {
    int height, width, channels;
    ResizeSpec spec;
  };
  const std::vector<Case> cases = {
      {37, 29, 3, {8, 11, ResizeMode::kStretch}},   // shrink, another aspect
      {5, 7, 1, {13, 9, ResizeMode::kStretch}},     // enlarge
      {30, 20, 3, {10, 10, ResizeMode::kCrop}},     // rows cut
      {31, 20, 1, {7, 9, ResizeMode::kCrop}},       // a window of fractional size and start
      {12, 40, 3, {6, 6, ResizeMode::kCrop}},       // columns cut
      {16, 16, 3, {16, 16, ResizeMode::kStretch}},  // the identity
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> image(static_cast<size_t>(c.height) * c.width * c.channels);
    for (uint8_t& v : image) v = static_cast<uint8_t>(level(random));
    std::vector<uint8_t> out(static_cast<size_t>(c.spec.height) * c.spec.width * c.channels);
    resize_image({image.data(), c.height, c.width, c.channels}, c.spec, out.data());
    const std::vector<double> want = reference_resize(image, c.height, c.width, c.channels, c.spec);
    for (size_t i = 0; i < out.size(); ++i) {
      // Halves round up; a value within rounding noise of a half may go either way.
      const bool tie = std::abs(want[i] - std::floor(want[i]) - 0.5) < 1e-9;
      ASSERT_LE(std::abs(out[i] - std::floor(want[i] + 0.5)), tie ? 1.0 : 0.0)
          << c.height << "x" << c.width << " -> " << c.spec.height << "x" << c.spec.width
          << ", element " << i << " (" << want[i] << ")";
    }
  }
}

TEST(ResizeImage, ParsesSizesAndModes) {
  const ResizeSpec spec = parse_resize("112x96", "--resize");
  EXPECT_EQ(spec.height, 112);
  EXPECT_EQ(spec.width, 96);
  for (const char* bad : {"112", "112x", "x112", "axb", "0x112", "112x0", " 112x112", "+112x112",
                          "112x112x3", "16385x16", "-1x5", ""}) {
    EXPECT_THROW(parse_resize(bad, "--resize"), UsageError) << bad;
  }
  EXPECT_NE(error_of([] { parse_resize("112", "--resize"); }).find("--resize '112' is not a size"),
            std::string::npos);
  EXPECT_EQ(parse_resize_mode("crop"), ResizeMode::kCrop);
  EXPECT_EQ(parse_resize_mode("stretch"), ResizeMode::kStretch);
  EXPECT_THROW(parse_resize_mode("fill"), UsageError);
}

}  // namespace
}  // namespace myriad
