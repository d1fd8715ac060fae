#include "myriad/data/synthetic_ijb.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "myriad/data/image_codec.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/file_io.h"
#include "myriad/util/hash_random.h"
#include "myriad/util/parallel_for.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

constexpr int kChannels = 3;
constexpr double kPi = 3.14159265358979323846;
// How a face sits in its loose crop: rotation up to 20 degrees either way, scale 0.8 to 1.4,
// crops of 150 to 200 pixels a side (more where a large, turned face needs it).
constexpr double kMaxRotation = 20.0 * kPi / 180.0;
constexpr double kMinScale = 0.8, kMaxScale = 1.4;
constexpr int kMinCropSide = 150, kMaxCropSide = 200;
// Landmarks are off by up to this many pixels either way, as a detector's are.
constexpr double kLandmarkNoise = 0.5;
// The background: a smooth field of kBackgroundCells x kBackgroundCells colours, plus uniform
// per-pixel noise of up to kBackgroundNoise grey levels either way.
constexpr int kBackgroundCells = 5;
constexpr int kBackgroundNoise = 12;
constexpr int kJpegQuality = 95;
// Pair lines are formatted into a buffer written out a MiB at a time.
constexpr size_t kFlushBytes = size_t{1} << 20;

// Streams of draws, one per use, so that no two uses share numbers.
enum Stream : uint64_t {
  kExtraImages = 1,
  kMedias,
  kTemplateIds,
  kMediaIds,
  kCrops,
  kBackgrounds,
  kPairs,
};

// A 64-bit draw keyed by (seed, stream, a, b).
uint64_t draw(uint64_t seed, Stream stream, uint64_t a, uint64_t b = 0) {
  return mix64(mix64(mix64(seed ^ (stream * 0x9E3779B97F4A7C15ull)) + a) ^ mix64(b));
}

// Uniform in [0, 1), 53 bits.
double uniform(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Increasing ids with gaps: index i becomes 1 + 3i + (0, 1 or 2), so that a reader that takes
// ids for indices fails.
int64_t sparse_id(uint64_t seed, Stream stream, int64_t index) {
  return 1 + 3 * index + static_cast<int64_t>(draw(seed, stream, index) % 3);
}

SyntheticIjbOptions checked(SyntheticIjbOptions o) {
  if (o.templates < 1 || o.images < 1 || o.identities < 0 || o.pairs < 2)
    throw UsageError(
        "--templates and --images must be positive, --identities not negative, --pairs at least 2");
  if (o.identities == 0) {
    o.identities = std::max<int64_t>(
        2, std::llround(static_cast<double>(o.templates) * kIjbcSubjectsPerTemplate));
  }
  if (o.identities < 2) throw UsageError("--identities must be at least 2 (impostor pairs)");
  if (o.templates < 2 * o.identities) {
    throw UsageError(
        str_format("--templates {} is fewer than two per identity ({} identities): genuine pairs "
                   "need two templates of one identity",
                   o.templates, o.identities));
  }
  if (o.images < o.templates) {
    throw UsageError(
        str_format("--images {} is fewer than --templates {}: every template needs "
                   "an image",
                   o.images, o.templates));
  }
  if (!(o.genuine_fraction > 0.0 && o.genuine_fraction < 1.0))
    throw UsageError("--genuine-fraction must be in (0, 1)");
  if (!(o.noise >= 0.0 && o.noise < 1e6)) throw UsageError("--noise must be in [0, 1e6)");
  if (o.workers < 1) throw UsageError("--workers must be positive");
  return o;
}

PrototypeOptions prototype_options(const SyntheticIjbOptions& o) {
  PrototypeOptions p;
  p.num_classes = o.identities;
  p.images_per_class = 1;
  p.channels = kChannels;
  p.height = kAlignedSide;
  p.width = kAlignedSide;
  p.seed = o.seed;
  p.noise = o.noise;
  return p;
}

// The smooth, noisy background of a crop, height x width x 3, into `out`.
void fill_background(uint64_t key, int height, int width, uint8_t* out) {
  constexpr int kCells = kBackgroundCells;
  std::array<double, kCells * kCells * kChannels> grid;
  for (size_t i = 0; i < grid.size(); ++i) grid[i] = 255.0 * uniform(mix64(key + i));
  uint64_t noise_key = mix64(key ^ 0xB4C6u);
  for (int y = 0; y < height; ++y) {
    const double gy = static_cast<double>(y) * (kCells - 1) / std::max(1, height - 1);
    const int y0 = std::min(static_cast<int>(gy), kCells - 2);
    const double fy = gy - y0;
    for (int x = 0; x < width; ++x) {
      const double gx = static_cast<double>(x) * (kCells - 1) / std::max(1, width - 1);
      const int x0 = std::min(static_cast<int>(gx), kCells - 2);
      const double fx = gx - x0;
      const uint64_t noise = mix64(++noise_key);
      for (int c = 0; c < kChannels; ++c) {
        const double* g = grid.data() + (y0 * kCells + x0) * kChannels + c;
        const double smooth =
            (g[0] * (1 - fx) + g[kChannels] * fx) * (1 - fy) +
            (g[kCells * kChannels] * (1 - fx) + g[(kCells + 1) * kChannels] * fx) * fy;
        const int jitter =
            static_cast<int>((noise >> (8 * c)) % (2 * kBackgroundNoise + 1)) - kBackgroundNoise;
        out[(static_cast<int64_t>(y) * width + x) * kChannels + c] = static_cast<uint8_t>(
            std::clamp(static_cast<int>(std::lround(smooth)) + jitter, 0, 255));
      }
    }
  }
}

// The similarity that puts the aligned face into a crop, and the crop's size: drawn from the
// image's draws, the face's 112 x 112 pixels wholly inside.
Affine place_face(uint64_t seed, int64_t image, int& height, int& width) {
  const auto u = [&](uint64_t k) { return uniform(draw(seed, kCrops, image, k)); };
  const double angle = (2.0 * u(0) - 1.0) * kMaxRotation;
  const double scale = kMinScale + (kMaxScale - kMinScale) * u(1);
  const double a = scale * std::cos(angle), b = scale * std::sin(angle);
  // The side of the turned face's bounding box, pixel edges included.
  const double extent = kAlignedSide * (std::abs(a) + std::abs(b));
  const auto side = [&](double draw_side) {
    const int drawn =
        kMinCropSide + static_cast<int>(draw_side * (kMaxCropSide - kMinCropSide + 1));
    return std::max(drawn, static_cast<int>(std::ceil(extent)) + 2);
  };
  height = side(u(2));
  width = side(u(3));
  // The face's centre anywhere that keeps its box inside the crop's pixel edges [-0.5, side - 0.5].
  const auto centre = [&](int side, double draw_centre) {
    const double low = extent / 2 - 0.5, high = side - 0.5 - extent / 2;
    return low + draw_centre * (high - low);
  };
  const double cx = centre(width, u(4)), cy = centre(height, u(5));
  const double middle = (kAlignedSide - 1) / 2.0;
  return {{a, -b, cx - (a * middle - b * middle), b, a, cy - (b * middle + a * middle)}};
}

// A canvas in the face's coordinates: the face's pixel (0, 0) lies at (left, top).
struct Canvas {
  int left = 0, top = 0, height = 0, width = 0;
};

// The canvas that holds every point a crop of height x width maps back to through
// `crop_to_face`, with two pixels to spare for interpolation.
Canvas canvas_around(const Affine& crop_to_face, int height, int width) {
  double min_x = 1e300, min_y = 1e300, max_x = -1e300, max_y = -1e300;
  for (const Point corner : {Point{-0.5, -0.5}, Point{width - 0.5, -0.5}, Point{-0.5, height - 0.5},
                             Point{width - 0.5, height - 0.5}}) {
    const Point p = crop_to_face.apply(corner);
    min_x = std::min(min_x, p.x);
    min_y = std::min(min_y, p.y);
    max_x = std::max(max_x, p.x);
    max_y = std::max(max_y, p.y);
  }
  Canvas c;
  c.left = static_cast<int>(std::ceil(-min_x)) + 2;
  c.top = static_cast<int>(std::ceil(-min_y)) + 2;
  c.width = c.left + static_cast<int>(std::ceil(max_x)) + 3;
  c.height = c.top + static_cast<int>(std::ceil(max_y)) + 3;
  return c;
}

// Appends `value` to `text`.
void append_integer(std::string& text, int64_t value) {
  char digits[24];
  text.append(digits, std::to_chars(digits, digits + sizeof(digits), value).ptr);
}

void append_fixed(std::string& text, double value, int precision) {
  char digits[64];
  text.append(digits, std::to_chars(digits, digits + sizeof(digits), value,
                                    std::chars_format::fixed, precision)
                          .ptr);
}

// A text file written from a buffer a MiB at a time.
class TextFile {
 public:
  explicit TextFile(const std::string& path) : path_(path), out_(path, std::ios::binary) {
    MYRIAD_CHECK(out_.is_open(), "cannot create '{}'", path);
  }
  std::string& text() { return text_; }
  void flush_when_full() {
    if (text_.size() >= kFlushBytes) flush();
  }
  void close() {
    flush();
    out_.close();
    MYRIAD_CHECK(!out_.fail(), "cannot write '{}' (disk full?)", path_);
  }

 private:
  void flush() {
    out_.write(text_.data(), static_cast<std::streamsize>(text_.size()));
    text_.clear();
  }
  std::string path_;
  std::ofstream out_;
  std::string text_;
};

}  // namespace

SyntheticIjb::SyntheticIjb(const SyntheticIjbOptions& options)
    : options_(checked(options)),
      identities_(options_.identities),
      faces_(prototype_options(options_)) {
  // Genuine pairs in IJB-C's proportion (or as asked), at least one of each kind.
  genuine_ = std::clamp<int64_t>(
      std::llround(static_cast<double>(options_.pairs) * options_.genuine_fraction), 1,
      options_.pairs - 1);
  build_templates();
}

void SyntheticIjb::build_templates() {
  const uint64_t seed = options_.seed;
  const int64_t t_count = options_.templates, n = options_.images;
  // One image per template, the rest spread at random.
  std::vector<int64_t> counts(static_cast<size_t>(t_count), 1);
  for (int64_t e = 0; e < n - t_count; ++e) ++counts[draw(seed, kExtraImages, e) % t_count];
  template_ids_.resize(static_cast<size_t>(t_count));
  image_template_.reserve(static_cast<size_t>(n));
  image_media_.reserve(static_cast<size_t>(n));
  for (int64_t t = 0; t < t_count; ++t) {
    template_ids_[t] = sparse_id(seed, kTemplateIds, t);
    // Its medias: videos of 2 to 6 frames (two in five) or single photos.
    for (int64_t left = counts[t], k = 0; left > 0; ++k) {
      const uint64_t bits = draw(seed, kMedias, t, k);
      const int64_t frames =
          left >= 2 && bits % 5 < 2 ? std::min<int64_t>(left, 2 + (bits >> 8) % 5) : 1;
      const int64_t media = static_cast<int64_t>(media_ids_.size());
      media_ids_.push_back(sparse_id(seed, kMediaIds, media));
      for (int64_t f = 0; f < frames; ++f) {
        image_template_.push_back(t);
        image_media_.push_back(media);
      }
      left -= frames;
    }
  }
}

std::string SyntheticIjb::image_name(int64_t image) {
  return std::to_string(image + 1) + ".jpg";
}

void SyntheticIjb::face(int64_t image, uint8_t* out) const {
  faces_.render(identity_of(template_of(image)), image, out);
}

LooseCrop SyntheticIjb::loose_crop(int64_t image) const {
  const uint64_t seed = options_.seed;
  LooseCrop crop;
  crop.face_to_crop = place_face(seed, image, crop.height, crop.width);
  for (size_t k = 0; k < crop.landmarks.size(); ++k) {
    const Point p = crop.face_to_crop.apply(kArcFaceTemplate[k]);
    const auto jitter = [&](uint64_t key) {
      return (2.0 * uniform(draw(seed, kCrops, image, key)) - 1.0) * kLandmarkNoise;
    };
    crop.landmarks[k] = {p.x + jitter(10 + 2 * k), p.y + jitter(11 + 2 * k)};
  }
  crop.score = static_cast<float>(0.5 + 0.5 * uniform(draw(seed, kCrops, image, 9)));

  // The face on a background canvas in the face's coordinates, large enough that every crop
  // pixel maps into it: then one warp makes the crop, face and background alike.
  const Canvas frame = canvas_around(crop.face_to_crop.inverse(), crop.height, crop.width);
  std::vector<uint8_t> canvas(static_cast<size_t>(frame.height) * frame.width * kChannels);
  fill_background(draw(seed, kBackgrounds, image), frame.height, frame.width, canvas.data());
  std::vector<uint8_t> face_pixels(static_cast<size_t>(kAlignedSide) * kAlignedSide * kChannels);
  face(image, face_pixels.data());
  const size_t row = static_cast<size_t>(kAlignedSide) * kChannels;
  for (int y = 0; y < kAlignedSide; ++y) {
    std::copy_n(face_pixels.data() + y * row, row,
                canvas.data() +
                    (static_cast<size_t>(frame.top + y) * frame.width + frame.left) * kChannels);
  }
  Affine canvas_to_crop = crop.face_to_crop;
  const std::array<double, 6>& m = crop.face_to_crop.m;
  canvas_to_crop.m[2] -= m[0] * frame.left + m[1] * frame.top;
  canvas_to_crop.m[5] -= m[3] * frame.left + m[4] * frame.top;
  crop.pixels.resize(static_cast<size_t>(crop.height) * crop.width * kChannels);
  warp_affine({canvas.data(), frame.height, frame.width, kChannels}, canvas_to_crop, crop.height,
              crop.width, crop.pixels.data());
  return crop;
}

TemplatePair SyntheticIjb::pair(int64_t index) const {
  const int64_t k_count = identities_, t_count = options_.templates, p = options_.pairs;
  MYRIAD_CHECK(index >= 0 && index < p, "pair {} is outside [0, {})", index, p);
  const uint64_t bits = draw(options_.seed, kPairs, index);
  const uint64_t more = mix64(bits);
  // Identity k's templates are k, k + K, k + 2K, ...
  const auto templates_of = [&](int64_t k) { return (t_count - 1 - k) / k_count + 1; };
  TemplatePair pair;
  pair.genuine = (index + 1) * genuine_ / p != index * genuine_ / p;
  if (pair.genuine) {
    const int64_t k = static_cast<int64_t>(bits % k_count), m = templates_of(k);
    const int64_t first = static_cast<int64_t>(more % m);
    const int64_t second = (first + 1 + static_cast<int64_t>(mix64(more) % (m - 1))) % m;
    pair.first = k + k_count * first;
    pair.second = k + k_count * second;
  } else {
    pair.first = static_cast<int64_t>(bits % t_count);
    const int64_t k =
        (identity_of(pair.first) + 1 + static_cast<int64_t>(more % (k_count - 1))) % k_count;
    pair.second = k + k_count * static_cast<int64_t>(mix64(more) % templates_of(k));
  }
  return pair;
}

void SyntheticIjb::write_faces(const std::string& path) const {
  TextFile file(path);
  for (int64_t i = 0; i < options_.images; ++i) {
    std::string& text = file.text();
    text += image_name(i);
    text += ' ';
    append_integer(text, template_id(template_of(i)));
    text += ' ';
    append_integer(text, media_id(i));
    text += '\n';
    file.flush_when_full();
  }
  file.close();
}

void SyntheticIjb::write_crops(const std::string& directory,
                               const std::string& landmarks_path) const {
  const int64_t n = options_.images;
  std::vector<std::array<Point, 5>> landmarks(static_cast<size_t>(n));
  std::vector<float> scores(static_cast<size_t>(n));
  ProgressBar progress("loose crops", n);
  std::mutex progress_mutex;
  parallel_for(n, options_.workers, [&](int64_t i) {
    const LooseCrop crop = loose_crop(i);
    write_whole_file(
        directory + "/" + image_name(i),
        encode_jpeg(crop.pixels.data(), crop.height, crop.width, kChannels, kJpegQuality));
    landmarks[i] = crop.landmarks;
    scores[i] = crop.score;
    const std::lock_guard<std::mutex> lock(progress_mutex);
    progress.advance(1);
  });
  progress.finish();

  TextFile file(landmarks_path);
  for (int64_t i = 0; i < n; ++i) {
    std::string& text = file.text();
    text += image_name(i);
    for (const Point& p : landmarks[i]) {
      text += ' ';
      append_fixed(text, p.x, 3);
      text += ' ';
      append_fixed(text, p.y, 3);
    }
    text += ' ';
    append_fixed(text, scores[i], 5);
    text += '\n';
    file.flush_when_full();
  }
  file.close();
}

void SyntheticIjb::write_pairs(const std::string& path) const {
  TextFile file(path);
  for (int64_t j = 0; j < options_.pairs; ++j) {
    const TemplatePair p = pair(j);
    std::string& text = file.text();
    append_integer(text, template_id(p.first));
    text += ' ';
    append_integer(text, template_id(p.second));
    text += p.genuine ? " 1\n" : " 0\n";
    file.flush_when_full();
  }
  file.close();
}

void SyntheticIjb::write(const std::string& root) const {
  namespace fs = std::filesystem;
  std::error_code error;
  MYRIAD_CHECK(!fs::exists(root, error) || (fs::is_directory(root) && fs::is_empty(root)),
               "'{}' exists and is not an empty directory: synthetic-ijb writes a new one", root);
  AtomicOutput output(root);
  const IjbLayout layout = ijb_layout(output.temporary_path(), options_.target);
  fs::create_directories(output.temporary_path() + "/meta");
  fs::create_directories(layout.loose_crop);
  write_faces(layout.faces);
  write_crops(layout.loose_crop, layout.landmarks);
  write_pairs(layout.pairs);
  output.commit();
}

}  // namespace myriad
