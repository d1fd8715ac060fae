#include "myriad/data/prototype_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

namespace {

// Prototype grey levels stay inside [kLow, kLow + kRange], leaving room for noise above and below
// before the clamp to [0, 255] loses information.
constexpr double kLow = 32.0, kRange = 192.0;

// A 64-bit draw keyed by (stream, a, b): two rounds of splitmix64, so that neighbouring keys
// (consecutive classes, views, cells) give unrelated numbers.
uint64_t draw(uint64_t stream, uint64_t a, uint64_t b) {
  return mix64(mix64(stream ^ mix64(a)) + b);
}

// Uniform in [0, 1) from the 16 bits of `bits` starting at `shift`.
double uniform16(uint64_t bits, int shift) {
  return static_cast<double>((bits >> shift) & 0xFFFF) / 65536.0;
}

// Roughly standard normal from one 64-bit draw: the sum of four 16-bit uniforms (Irwin-Hall,
// variance 4/12), centred and scaled. Bounded at +-3.5 sigma, which the clamp to bytes would
// flatten anyway, and far cheaper than Box-Muller for the hundreds of millions of pixels of a
// large set.
double normal(uint64_t bits) {
  const double sum =
      uniform16(bits, 0) + uniform16(bits, 16) + uniform16(bits, 32) + uniform16(bits, 48);
  return (sum - 2.0) * std::sqrt(3.0);
}

}  // namespace

PrototypeDataset::PrototypeDataset(const PrototypeOptions& options)
    : options_(options),
      prototype_stream_(mix64(options.seed ^ 0x70726F746F747970ull)),  // "prototyp"
      view_stream_(mix64(options.seed ^ 0x76696577ull)) {              // "view"
  MYRIAD_CHECK(options.num_classes > 0 && options.images_per_class > 0,
               "prototype data needs a positive class count and images per class, got {} and {}",
               options.num_classes, options.images_per_class);
  MYRIAD_CHECK(
      options.num_classes <= std::numeric_limits<int64_t>::max() / options.images_per_class,
      "{} classes of {} images each are too many images", options.num_classes,
      options.images_per_class);
  MYRIAD_CHECK(options.channels > 0 && options.height > 0 && options.width > 0,
               "prototype images need a positive shape, got {}x{}x{}", options.channels,
               options.height, options.width);
  MYRIAD_CHECK(options.first_view >= 0, "the first view must not be negative, got {}",
               options.first_view);
  MYRIAD_CHECK(options.cells >= 2 && options.cells <= 1024,
               "a prototype needs 2 to 1024 cells per side, got {}", options.cells);
  MYRIAD_CHECK(std::isfinite(options.noise) && std::isfinite(options.shift) &&
                   std::isfinite(options.brightness) && options.noise >= 0 && options.shift >= 0 &&
                   options.brightness >= 0,
               "prototype noise, shift and brightness must be finite and not negative, got {}, {} "
               "and {}",
               options.noise, options.shift, options.brightness);
  info_.name = "prototypes";
  info_.size = options.num_classes * options.images_per_class;
  info_.num_classes = options.num_classes;
  info_.channels = options.channels;
  info_.height = options.height;
  info_.width = options.width;
}

int64_t PrototypeDataset::label(int64_t index) const {
  MYRIAD_CHECK(index >= 0 && index < info_.size, "prototype image {} is outside [0, {})", index,
               info_.size);
  return index / options_.images_per_class;
}

int64_t PrototypeDataset::view(int64_t index) const {
  MYRIAD_CHECK(index >= 0 && index < info_.size, "prototype image {} is outside [0, {})", index,
               info_.size);
  return options_.first_view + index % options_.images_per_class;
}

void PrototypeDataset::read(const std::vector<int64_t>& indices, uint8_t* out) const {
  const int64_t image_bytes = static_cast<int64_t>(info_.height) * info_.width * info_.channels;
  for (size_t i = 0; i < indices.size(); ++i)
    render(label(indices[i]), view(indices[i]), out + static_cast<int64_t>(i) * image_bytes);
}

void PrototypeDataset::render(int64_t klass, int64_t view, uint8_t* out) const {
  MYRIAD_CHECK(klass >= 0 && klass < info_.num_classes && view >= 0,
               "no view {} of class {}: classes are [0, {}), views not negative", view, klass,
               info_.num_classes);
  const int h = info_.height, w = info_.width, c = info_.channels, cells = options_.cells;
  const uint64_t k = static_cast<uint64_t>(klass);
  // Cell (y, x) and its mirror image (y, cells - 1 - x) draw the same grey level.
  std::vector<double> grid(static_cast<size_t>(c) * cells * cells);
  for (int ch = 0; ch < c; ++ch) {
    for (int gy = 0; gy < cells; ++gy) {
      for (int gx = 0; gx < cells; ++gx) {
        const int64_t cell = (static_cast<int64_t>(ch) * cells + gy) * cells;
        const uint64_t key = static_cast<uint64_t>(cell + std::min(gx, cells - 1 - gx));
        grid[static_cast<size_t>(cell + gx)] =
            kLow + kRange * uniform16(draw(prototype_stream_, k, key), 24);
      }
    }
  }
  const uint64_t view_bits = draw(view_stream_, k, static_cast<uint64_t>(view));
  const uint64_t noise_key = mix64(view_bits);
  const double shift_y = (2.0 * uniform16(view_bits, 0) - 1.0) * options_.shift;
  const double shift_x = (2.0 * uniform16(view_bits, 16) - 1.0) * options_.shift;
  const double brightness = (2.0 * uniform16(view_bits, 32) - 1.0) * options_.brightness;

  // Pixel centres map onto the grid, whose cell centres lie at integer coordinates; the view's
  // shift moves the sampling point, and bilinear interpolation between the four nearest cell
  // centres (clamped at the border) gives the prototype there. The shift's distribution is
  // symmetric, so the mirror image of a view is distributed as a view.
  auto locate = [cells](int pixel, int size, double shift, int* low, double* fraction) {
    const double g =
        std::clamp((pixel + 0.5) * cells / size - 0.5 + shift, 0.0, static_cast<double>(cells - 1));
    *low = std::min(static_cast<int>(g), cells - 2);
    *fraction = g - *low;
  };
  for (int y = 0; y < h; ++y) {
    int gy;
    double fy;
    locate(y, h, shift_y, &gy, &fy);
    for (int x = 0; x < w; ++x) {
      int gx;
      double fx;
      locate(x, w, shift_x, &gx, &fx);
      const int64_t pixel = (static_cast<int64_t>(y) * w + x) * c;
      for (int ch = 0; ch < c; ++ch) {
        const double* g = grid.data() + static_cast<size_t>(ch) * cells * cells;
        const double* top = g + gy * cells + gx;
        const double* bottom = top + cells;
        const double value = (top[0] * (1 - fx) + top[1] * fx) * (1 - fy) +
                             (bottom[0] * (1 - fx) + bottom[1] * fx) * fy + brightness +
                             options_.noise * normal(mix64(noise_key + pixel + ch));
        out[pixel + ch] = static_cast<uint8_t>(std::clamp(std::lround(value), 0L, 255L));
      }
    }
  }
}

PrototypePairs::PrototypePairs(const PrototypeDataset& prototypes, int64_t pairs)
    : prototypes_(prototypes), stream_(mix64(prototypes.options().seed ^ 0x7061697273ull)) {
  const int64_t first_view = prototypes.options().first_view;
  MYRIAD_CHECK(pairs > 0 && pairs <= (std::numeric_limits<int64_t>::max() - first_view) / 2,
               "cannot make {} pairs from view {} on", pairs, first_view);
  MYRIAD_CHECK(prototypes.info().num_classes >= 2,
               "pairs of different classes need at least 2 classes, got {}",
               prototypes.info().num_classes);
  info_ = prototypes.info();
  info_.name = "prototype pairs";
  info_.size = 2 * pairs;
}

int64_t PrototypePairs::label(int64_t index) const {
  MYRIAD_CHECK(index >= 0 && index < info_.size, "pair image {} is outside [0, {})", index,
               info_.size);
  const uint64_t classes = static_cast<uint64_t>(info_.num_classes);
  const uint64_t bits = mix64(stream_ + static_cast<uint64_t>(index / 2));
  const uint64_t first = bits % classes;
  if (index % 2 == 0 || same(index / 2)) return static_cast<int64_t>(first);
  // Any class but the first, each equally likely.
  return static_cast<int64_t>((first + 1 + mix64(bits) % (classes - 1)) % classes);
}

void PrototypePairs::read(const std::vector<int64_t>& indices, uint8_t* out) const {
  const int64_t image_bytes = static_cast<int64_t>(info_.height) * info_.width * info_.channels;
  for (size_t i = 0; i < indices.size(); ++i) {
    prototypes_.render(label(indices[i]), prototypes_.options().first_view + indices[i],
                       out + static_cast<int64_t>(i) * image_bytes);
  }
}

std::vector<uint8_t> PrototypePairs::issame() const {
  std::vector<uint8_t> flags(static_cast<size_t>(info_.size / 2));
  for (size_t i = 0; i < flags.size(); ++i) flags[i] = same(static_cast<int64_t>(i)) ? 1 : 0;
  return flags;
}

}  // namespace myriad
