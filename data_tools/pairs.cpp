// myriad-data pairs: a verification pairs file (docs/data-format.md) drawn from a labelled
// dataset, for identities that training never saw: pair i shows one identity when i is even and
// two when it is odd, so that each of the 10 consecutive folds of the 10-fold protocol is half and
// half. The images are copied as they are stored (encoded bytes or raw pixels).

#include <torch/types.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/hash_random.h"
#include "myriad/util/log.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

// Images copied per block: at most this many, and at most kBlockBytes of raw pixels.
constexpr int64_t kBlockImages = 4096;
constexpr int64_t kBlockBytes = int64_t{256} << 20;

struct PairsOptions {
  std::string data, output;
  int64_t pairs = 6000;
  uint64_t seed = 0;
};

bool parse_pairs_options(const ProcessContext& context, int argc, char** argv, PairsOptions& o) {
  po::options_description options("pairs options");
  // clang-format off
  options.add_options()
      ("data", po::value(&o.data)->required(), "labelled HDF5 dataset (from-folder, from-rec, ...) whose images the pairs show")
      ("output", po::value(&o.output)->required(), "HDF5 pairs file to write (myriad-train --eval-pairs, myriad-embed)")
      ("pairs", count_option(&o.pairs), "pairs: an even number, at least 10; half of them of one identity")
      ("seed", po::value(&o.seed)->default_value(o.seed), "seed of the draw: the same seed draws the same pairs");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data pairs --data X.h5 --output PAIRS.h5 [--pairs N] "
                          "[--seed S]",
                          context.rank())) {
    return false;
  }
  if (o.pairs < 10 || o.pairs % 2 != 0) {
    throw UsageError(str_format(
        "--pairs must be an even number of at least 10 (10 folds, each half of one identity), "
        "got {}",
        o.pairs));
  }
  if (std::filesystem::weakly_canonical(o.data) == std::filesystem::weakly_canonical(o.output))
    throw UsageError("--output must not be --data");
  return true;
}

// The images of each class, and the classes a pair can draw from.
struct Classes {
  std::vector<std::vector<int64_t>> images;
  std::vector<int64_t> with_images;  // for pairs of two identities
  std::vector<int64_t> with_two;     // for pairs of one identity
};

Classes group_by_class(const Hdf5ImageDataset& data) {
  Classes c;
  c.images.resize(static_cast<size_t>(data.info().num_classes));
  for (int64_t i = 0; i < data.info().size; ++i) c.images[data.label(i)].push_back(i);
  for (size_t k = 0; k < c.images.size(); ++k) {
    if (!c.images[k].empty()) c.with_images.push_back(static_cast<int64_t>(k));
    if (c.images[k].size() >= 2) c.with_two.push_back(static_cast<int64_t>(k));
  }
  const std::string& name = data.info().name;
  MYRIAD_CHECK(c.with_images.size() >= 2,
               "'{}' has images of {} class{}: pairs of two identities need at least 2", name,
               c.with_images.size(), c.with_images.size() == 1 ? "" : "es");
  MYRIAD_CHECK(!c.with_two.empty(),
               "no class of '{}' has two images: pairs of one identity need at least one such "
               "class",
               name);
  return c;
}

// Counter-based draws: the numbers of pair i depend on (seed, i) alone.
class PairDraw {
 public:
  PairDraw(uint64_t seed, int64_t pair)
      : state_(mix64(mix64(seed ^ 0x70616972ull) + static_cast<uint64_t>(pair))) {}
  // Uniform in [0, n).
  int64_t below(size_t n) {
    state_ = mix64(state_);
    return static_cast<int64_t>(state_ % n);
  }
  // Uniform in [0, n) except `not_this`.
  int64_t other_than(int64_t not_this, size_t n) {
    return (not_this + 1 + below(n - 1)) % static_cast<int64_t>(n);
  }

 private:
  uint64_t state_;
};

// The images of every pair: 2i and 2i + 1 for pair i. Even pairs take two different images of
// one class (drawn among the classes with two), odd pairs one image of each of two classes.
std::vector<int64_t> draw_pairs(const Classes& c, int64_t pairs, uint64_t seed) {
  std::vector<int64_t> images(static_cast<size_t>(2 * pairs));
  for (int64_t i = 0; i < pairs; ++i) {
    PairDraw draw(seed, i);
    if (i % 2 == 0) {
      const std::vector<int64_t>& members = c.images[c.with_two[draw.below(c.with_two.size())]];
      const int64_t a = draw.below(members.size());
      images[2 * i] = members[a];
      images[2 * i + 1] = members[draw.other_than(a, members.size())];
    } else {
      const int64_t a = draw.below(c.with_images.size());
      const int64_t b = draw.other_than(a, c.with_images.size());
      for (const int64_t k : {a, b}) {
        const std::vector<int64_t>& members = c.images[c.with_images[k]];
        images[2 * i + (k == a ? 0 : 1)] = members[draw.below(members.size())];
      }
    }
  }
  return images;
}

// Images `indices` of `data` into rows [begin, ...) of `writer`, as they are stored: one HDF5
// read of the distinct rows in file order.
void copy_images(const Hdf5ImageDataset& data, const std::vector<int64_t>& indices, int64_t begin,
                 Hdf5ImageWriter& writer) {
  std::vector<int64_t> rows = indices;
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<int64_t> position(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    position[i] = std::lower_bound(rows.begin(), rows.end(), indices[i]) - rows.begin();
  }
  if (data.info().encoded) {
    const std::vector<std::string> stored = data.file().read_bytes_list("images", rows);
    std::vector<std::string> images;
    for (const int64_t p : position) images.push_back(stored[p]);
    writer.write_encoded(begin, images);
  } else {
    const torch::Tensor stored = data.file().read_row_list("images", rows);
    const torch::Tensor images =
        stored.index_select(0, torch::tensor(position, torch::kInt64)).contiguous();
    writer.write_raw(begin, images.data_ptr<uint8_t>(), images.size(0));
  }
}

}  // namespace

int run_pairs(ProcessContext& context, int argc, char** argv) {
  PairsOptions o;
  if (!parse_pairs_options(context, argc, argv, o)) return kExitOk;
  const Hdf5ImageDataset data(o.data, /*labelled=*/true, /*resident_bytes=*/0);
  const DatasetInfo& info = data.info();
  const Classes classes = group_by_class(data);
  const std::vector<int64_t> images = draw_pairs(classes, o.pairs, o.seed);

  Hdf5ImageWriter writer(o.output, 2 * o.pairs, info.height, info.width, info.channels,
                         info.encoded, /*num_classes=*/0);
  writer.set_attribute("source",
                       str_format("myriad-data pairs --data {} --seed {}", o.data, o.seed));
  const int64_t image_bytes = static_cast<int64_t>(info.height) * info.width * info.channels;
  const int64_t block = std::clamp<int64_t>(kBlockBytes / image_bytes, 2, kBlockImages);
  ProgressBar progress("pairs", 2 * o.pairs);
  for (int64_t begin = 0; begin < 2 * o.pairs; begin += block) {
    const int64_t count = std::min(block, 2 * o.pairs - begin);
    copy_images(data, {images.begin() + begin, images.begin() + begin + count}, begin, writer);
    progress.advance(count);
  }
  progress.finish();
  std::vector<uint8_t> issame(static_cast<size_t>(o.pairs));
  for (int64_t i = 0; i < o.pairs; ++i) issame[i] = i % 2 == 0 ? 1 : 0;
  writer.write_issame(issame);
  writer.finish();
  log_info(
      "wrote {}: {} pairs ({} of one identity, {} of two) of {}x{}x{} images ({}) from {} "
      "classes of {}",
      o.output, o.pairs, o.pairs / 2, o.pairs / 2, info.height, info.width, info.channels,
      info.encoded ? "encoded, as stored" : "raw", classes.with_images.size(), o.data);
  return kExitOk;
}

}  // namespace myriad
