#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace myriad {

// insightface's IJB-B/C 1:1 verification (recognition/arcface_torch/eval_ijbc.py), step by step
// (docs/evaluation.md): image features, their pooling into templates, the cosine of each template
// pair, scikit-learn's ROC and TAR at FAR. Every step runs on the tensors' device, batched.

// eval_ijbc.py's switches; the defaults are its defaults.
struct IjbFeatureOptions {
  bool flip = true;               // add the mirror image's raw embedding (its F1 mode)
  bool detector_score = true;     // multiply by the detector score (D1)
  bool normalize_images = false;  // L2-normalise each image's feature before the score (N0)
};

// Each image's feature, float64 [n, D] on raw's device: its raw embedding `raw` [n, D] (plus its
// mirror image's `mirrored` with options.flip), L2-normalised with options.normalize_images,
// times its detector score `scores` [n] with options.detector_score.
torch::Tensor ijb_image_features(const torch::Tensor& raw, const torch::Tensor& mirrored,
                                 const torch::Tensor& scores, const IjbFeatureOptions& options);

// The distinct template ids of images `templates` [N], ascending (np.unique), and each image's
// row among them: {ids [T], rows [N]}, int64 on templates' device.
std::pair<torch::Tensor, torch::Tensor> template_rows(const torch::Tensor& templates);

// Each image's weight in its template's feature, float64 [N]: 1 / the images of its media in its
// template, since image2template_feature averages a media's images and sums a template's medias.
// `rows` are template_rows' (or any one number per template), `medias` [N] the media ids.
torch::Tensor media_weights(const torch::Tensor& rows, const torch::Tensor& medias);

// Template features summed image by image as the embeddings arrive, in float64 on one device.
class TemplatePool {
 public:
  // `rows`: each image's template row (template_rows), `weights`: media_weights.
  TemplatePool(int64_t templates, const torch::Tensor& rows, const torch::Tensor& weights,
               int64_t dim, const torch::Device& device);
  // Adds the features (ijb_image_features) of images [first, first + n).
  void add(int64_t first, const torch::Tensor& features);
  // The templates' features [T, D] float64, L2-normalised (a zero one stays zero, as
  // sklearn.preprocessing.normalize leaves it).
  torch::Tensor normalized() const;

 private:
  torch::Tensor rows_;
  torch::Tensor weights_;
  torch::Tensor sums_;
};

// The rows [P, 2] (of `ids`, template_rows' ascending ids) of the templates of `pairs` [P, 2];
// an Error naming `what` and the first pair whose template is not among them (it has no image).
torch::Tensor pair_rows(const torch::Tensor& ids, const torch::Tensor& pairs,
                        const std::string& what);

// The cosine similarity of each pair, float64 [P] on the features' device: the dot product of
// the L2-normalised template features [T, D] of its rows [P, 2], `batch` pairs at a time (0: as
// many as take about 256 MiB per side).
torch::Tensor pair_scores(const torch::Tensor& features, const torch::Tensor& rows,
                          int64_t batch = 0);

// scikit-learn's roc_curve(labels, scores) with drop_intermediate=True: one point per distinct
// score, highest first, counting the pairs at or above it (true and false positives); a point
// dropped where both counts' second differences are 0 (inside a straight run); (0, 0) first.
struct Roc {
  torch::Tensor fpr;         // float64 [K]: false positives / impostor pairs
  torch::Tensor tpr;         // float64 [K]: true positives / genuine pairs
  torch::Tensor thresholds;  // float64 [K]: the score of each point (+inf at the first)
  int64_t genuine = 0;
  int64_t impostors = 0;
};
// `labels` [P] (1: the same identity, 0 not), `scores` [P]; both kinds of pair must be present.
Roc roc_curve(const torch::Tensor& labels, const torch::Tensor& scores);

struct TarAtFar {
  double far = 0.0;        // asked for
  double tar = 0.0;        // the tpr of the chosen point
  double fpr = 0.0;        // its fpr
  double threshold = 0.0;  // its score threshold
};
// TAR at each FAR as eval_ijbc.py takes it: the ROC point whose fpr is nearest the FAR, the last
// of those in the ROC's order (it reverses the curve before its min(zip(abs(fpr - far),
// range(len(fpr))))): at one fpr, the one of the largest tpr.
std::vector<TarAtFar> tar_at_far(const Roc& roc, const std::vector<double>& fars);

// A FAR below 1 / impostors cannot be measured (no threshold has so few false accepts to give):
// an Error naming the first such FAR and how many impostor pairs it needs. `what` names the set.
void check_far_reachable(const std::vector<double>& fars, int64_t impostors,
                         const std::string& what);

// insightface's rates, as --far takes them.
inline constexpr const char* kIjbFars = "1e-6,1e-5,1e-4,1e-3,1e-2,1e-1";
// A comma list of rates in (0, 1] ("1e-6,1e-4,0.01"); anything else is a UsageError naming
// `option`.
std::vector<double> parse_far_list(const std::string& text, const std::string& option);
// `value` as Python's str(float) writes it: 1e-06, 1e-05, 0.0001, 0.001, 0.5, 1.0.
std::string python_float_text(double value);

}  // namespace myriad
