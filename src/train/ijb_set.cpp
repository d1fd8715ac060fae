#include "myriad/train/ijb_set.h"

#include <torch/torch.h>

#include <sstream>
#include <tuple>
#include <vector>

#include "myriad/train/ijb_protocol.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream text;
  text << "[";
  for (size_t i = 0; i < shape.size(); ++i) text << (i > 0 ? ", " : "") << shape[i];
  text << "]";
  return text.str();
}

// Dataset `name` of `file`, shaped `shape`, of floating-point numbers or integers as `floating`
// says, read as float32 or int64.
torch::Tensor read_dataset(const Hdf5File& file, const std::string& name,
                           const std::vector<int64_t>& shape, bool floating) {
  const std::vector<int64_t> stored = file.shape(name);
  MYRIAD_CHECK(stored == shape, "'{}': /{} is shaped {}, where /images and /pairs need {}",
               file.path(), name, shape_text(stored), shape_text(shape));
  const bool stored_floating = c10::isFloatingType(file.dtype(name));
  MYRIAD_CHECK(stored_floating == floating, "'{}': /{} holds {}; it must hold {}", file.path(),
               name, file.dtype(name), floating ? "floating-point numbers" : "integers");
  return file.read(name).to(floating ? torch::kFloat32 : torch::kInt64);
}

// The first position of `bad` [n] (bool) that is true, or -1.
int64_t first_true(const torch::Tensor& bad) {
  return bad.any().item<bool>() ? bad.nonzero()[0][0].item<int64_t>() : -1;
}

}  // namespace

IjbSet read_ijb_set(const std::string& path) {
  const Hdf5File file(path, Hdf5File::Mode::kRead);
  for (const char* name : {"images", "templates", "medias", "scores", "pairs", "pair_labels"}) {
    MYRIAD_CHECK(file.has(name),
                 "'{}' is not an IJB evaluation file: it has no /{} (docs/data-format.md; "
                 "myriad-data from-ijb writes them)",
                 path, name);
  }
  const int64_t images = file.shape("images").at(0);
  const std::vector<int64_t> pairs_shape = file.shape("pairs");
  MYRIAD_CHECK(pairs_shape.size() == 2 && pairs_shape[1] == 2,
               "'{}': /pairs is shaped {}; it holds two template ids per pair, [P, 2]", path,
               shape_text(pairs_shape));
  IjbSet set;
  set.target = file.string_attribute("/", "ijb_target").value_or("IJB");
  set.templates = read_dataset(file, "templates", {images}, false);
  set.medias = read_dataset(file, "medias", {images}, false);
  set.scores = read_dataset(file, "scores", {images}, true);
  const torch::Tensor pairs = read_dataset(file, "pairs", pairs_shape, false);
  set.labels = read_dataset(file, "pair_labels", {pairs_shape[0]}, false);

  const int64_t bad_score = first_true(torch::isfinite(set.scores).logical_not());
  MYRIAD_CHECK(bad_score < 0, "'{}': /scores[{}] is {}: detector scores must be finite", path,
               bad_score, bad_score < 0 ? 0.0f : set.scores[bad_score].item<float>());
  const int64_t bad_label = first_true(set.labels.ne(0).logical_and(set.labels.ne(1)));
  MYRIAD_CHECK(bad_label < 0,
               "'{}': /pair_labels[{}] is {}: a pair's label is 1 (one identity) or 0 (two)", path,
               bad_label, bad_label < 0 ? 0 : set.labels[bad_label].item<int64_t>());
  set.genuine = set.labels.sum().item<int64_t>();
  set.impostors = set.pairs() - set.genuine;
  MYRIAD_CHECK(set.genuine > 0 && set.impostors > 0,
               "'{}' has {} genuine pairs (label 1) and {} impostor pairs (label 0): verification "
               "needs both",
               path, set.genuine, set.impostors);
  std::tie(set.template_ids, set.image_rows) = template_rows(set.templates);
  set.pair_rows = pair_rows(set.template_ids, pairs, path);
  return set;
}

}  // namespace myriad
