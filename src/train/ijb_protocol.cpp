#include "myriad/train/ijb_protocol.h"

#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "myriad/util/error.h"

namespace myriad {

namespace {

// Each row of `x` [n, D] divided by its L2 norm; a row whose norm is below 10 machine epsilons is
// left as it is, as sklearn.preprocessing.normalize leaves it (_handle_zeros_in_scale).
torch::Tensor normalize_rows(const torch::Tensor& x) {
  const torch::Tensor norms = x.norm(2, 1, true);
  return x / norms.masked_fill(norms < 10 * DBL_EPSILON, 1.0);
}

// numpy's diff(x, 2): x[i + 2] - 2 x[i + 1] + x[i].
torch::Tensor second_difference(const torch::Tensor& x) {
  const int64_t n = x.size(0);
  return x.slice(0, 2, n) - 2 * x.slice(0, 1, n - 1) + x.slice(0, 0, n - 2);
}

// A boolean [1], true, on `like`'s device.
torch::Tensor true_at_one(const torch::Tensor& like) {
  return torch::ones({1}, torch::dtype(torch::kBool).device(like.device()));
}

torch::Tensor prepend(const torch::Tensor& x, double value) {
  return torch::cat({torch::full({1}, value, x.options()), x});
}

}  // namespace

torch::Tensor ijb_image_features(const torch::Tensor& raw, const torch::Tensor& mirrored,
                                 const torch::Tensor& scores, const IjbFeatureOptions& options) {
  torch::Tensor features = raw.to(torch::kFloat64);
  if (options.flip) {
    MYRIAD_CHECK(mirrored.defined() && mirrored.sizes() == raw.sizes(),
                 "the flip test needs the mirror images' embeddings, of raw's shape");
    features = features + mirrored.to(raw.device(), torch::kFloat64);
  }
  if (options.normalize_images) features = normalize_rows(features);
  if (options.detector_score)
    features = features * scores.to(raw.device(), torch::kFloat64).reshape({-1, 1});
  return features;
}

std::pair<torch::Tensor, torch::Tensor> template_rows(const torch::Tensor& templates) {
  const auto unique = torch::_unique2(templates.to(torch::kInt64), /*sorted=*/true,
                                      /*return_inverse=*/true);
  return {std::get<0>(unique), std::get<1>(unique)};
}

torch::Tensor media_weights(const torch::Tensor& rows, const torch::Tensor& medias) {
  const torch::Tensor keys = torch::stack({rows.to(torch::kInt64), medias.to(torch::kInt64)}, 1);
  const auto groups = torch::unique_dim(keys, 0, /*sorted=*/true, /*return_inverse=*/true,
                                        /*return_counts=*/true);
  const torch::Tensor counts = std::get<2>(groups).index_select(0, std::get<1>(groups));
  return 1.0 / counts.to(torch::kFloat64);
}

TemplatePool::TemplatePool(int64_t templates, const torch::Tensor& rows,
                           const torch::Tensor& weights, int64_t dim, const torch::Device& device)
    : rows_(rows.to(device, torch::kInt64)),
      weights_(weights.to(device, torch::kFloat64)),
      sums_(torch::zeros({templates, dim}, torch::dtype(torch::kFloat64).device(device))) {}

void TemplatePool::add(int64_t first, const torch::Tensor& features) {
  const int64_t n = features.size(0);
  MYRIAD_CHECK(first >= 0 && first + n <= rows_.size(0), "images [{}, {}) of {} to pool", first,
               first + n, rows_.size(0));
  const torch::Tensor weighted =
      features.to(sums_.device(), torch::kFloat64) * weights_.narrow(0, first, n).unsqueeze(1);
  sums_.index_add_(0, rows_.narrow(0, first, n), weighted);
}

torch::Tensor TemplatePool::normalized() const {
  return normalize_rows(sums_);
}

torch::Tensor pair_rows(const torch::Tensor& ids, const torch::Tensor& pairs,
                        const std::string& what) {
  const torch::Tensor wanted = pairs.to(ids.device(), torch::kInt64).contiguous();
  MYRIAD_CHECK(ids.numel() > 0 || wanted.numel() == 0, "'{}' has pairs but no templates", what);
  const torch::Tensor rows = torch::searchsorted(ids, wanted).clamp_max(ids.numel() - 1);
  const torch::Tensor found = ids.index_select(0, rows.reshape({-1})).view_as(wanted).eq(wanted);
  if (!found.all().item<bool>()) {
    const int64_t pair = found.all(1).logical_not().nonzero()[0][0].item<int64_t>();
    const int64_t side = found[pair][0].item<bool>() ? 1 : 0;
    MYRIAD_THROW("'{}': pair {} names template {}, which has no image", what, pair,
                 wanted[pair][side].item<int64_t>());
  }
  return rows;
}

torch::Tensor pair_scores(const torch::Tensor& features, const torch::Tensor& rows, int64_t batch) {
  const int64_t pairs = rows.size(0);
  if (batch <= 0) batch = std::max<int64_t>(1, (int64_t{256} << 20) / (features.size(1) * 8));
  const torch::Tensor on_device = rows.to(features.device(), torch::kInt64);
  torch::Tensor scores = torch::empty({pairs}, features.options());
  for (int64_t from = 0; from < pairs; from += batch) {
    const torch::Tensor part = on_device.narrow(0, from, std::min(batch, pairs - from));
    const torch::Tensor first = features.index_select(0, part.select(1, 0));
    const torch::Tensor second = features.index_select(0, part.select(1, 1));
    scores.narrow(0, from, part.size(0)).copy_((first * second).sum(1));
  }
  return scores;
}

Roc roc_curve(const torch::Tensor& labels, const torch::Tensor& scores) {
  const int64_t n = scores.numel();
  MYRIAD_CHECK(n > 0 && labels.numel() == n,
               "a ROC needs a label for each of its {} scores, got {}", n, labels.numel());
  // scikit-learn refuses them too: a diverged backbone, or fp16 that overflowed, gives them.
  const int64_t non_finite = torch::isfinite(scores).logical_not().sum().item<int64_t>();
  MYRIAD_CHECK(non_finite == 0,
               "{} of {} pair scores are not finite: the backbone's embeddings of some images are "
               "not (a diverged model, or a precision that overflowed)",
               non_finite, n);
  const auto sorted = scores.reshape({-1}).to(torch::kFloat64).sort(/*stable=*/true, 0, true);
  const torch::Tensor& descending = std::get<0>(sorted);
  const torch::Tensor genuine = labels.reshape({-1})
                                    .to(scores.device(), torch::kInt64)
                                    .index_select(0, std::get<1>(sorted))
                                    .cumsum(0);
  // The last of each run of equal scores: a threshold there counts the whole run.
  const torch::Tensor run_ends =
      torch::cat({descending.slice(0, 0, n - 1).ne(descending.slice(0, 1, n)), true_at_one(scores)})
          .nonzero()
          .squeeze(1);
  torch::Tensor tps = genuine.index_select(0, run_ends);
  torch::Tensor fps = run_ends + 1 - tps;
  torch::Tensor thresholds = descending.index_select(0, run_ends);
  if (tps.size(0) > 2) {
    const torch::Tensor kept =
        torch::cat({true_at_one(fps),
                    second_difference(fps).ne(0).logical_or(second_difference(tps).ne(0)),
                    true_at_one(fps)})
            .nonzero()
            .squeeze(1);
    tps = tps.index_select(0, kept);
    fps = fps.index_select(0, kept);
    thresholds = thresholds.index_select(0, kept);
  }
  Roc roc;
  roc.genuine = tps[-1].item<int64_t>();
  roc.impostors = fps[-1].item<int64_t>();
  MYRIAD_CHECK(roc.genuine > 0 && roc.impostors > 0,
               "a ROC needs genuine and impostor pairs, got {} and {}", roc.genuine, roc.impostors);
  roc.tpr = prepend(tps.to(torch::kFloat64), 0.0) / static_cast<double>(roc.genuine);
  roc.fpr = prepend(fps.to(torch::kFloat64), 0.0) / static_cast<double>(roc.impostors);
  roc.thresholds = prepend(thresholds, std::numeric_limits<double>::infinity());
  return roc;
}

std::vector<TarAtFar> tar_at_far(const Roc& roc, const std::vector<double>& fars) {
  const torch::Tensor places =
      torch::arange(roc.fpr.size(0), roc.fpr.options().dtype(torch::kInt64));
  std::vector<TarAtFar> result;
  for (double far : fars) {
    const torch::Tensor distance = (roc.fpr - far).abs();
    const torch::Tensor nearest = distance.eq(distance.min());
    const int64_t at = places.masked_fill(nearest.logical_not(), -1).max().item<int64_t>();
    TarAtFar point;
    point.far = far;
    point.tar = roc.tpr[at].item<double>();
    point.fpr = roc.fpr[at].item<double>();
    point.threshold = roc.thresholds[at].item<double>();
    result.push_back(point);
  }
  return result;
}

void check_far_reachable(const std::vector<double>& fars, int64_t impostors,
                         const std::string& what) {
  for (double far : fars) {
    // With fewer impostor pairs than 1 / FAR the smallest false accept rate above 0 is already
    // beyond the FAR: the number would be read at fpr 0 or above the FAR, not at it.
    if (far * static_cast<double>(impostors) >= 1.0 - 1e-9) continue;
    MYRIAD_THROW(
        "FAR {} cannot be measured on '{}': it has {} impostor pairs, and a false accept rate of "
        "{} "
        "needs at least {} (--far sets the rates)",
        python_float_text(far), what, impostors, python_float_text(far),
        static_cast<int64_t>(std::ceil(1.0 / far - 1e-9)));
  }
}

std::vector<double> parse_far_list(const std::string& text, const std::string& option) {
  std::vector<double> fars;
  std::stringstream items(text);
  std::string item;
  const auto bad = [&] {
    return UsageError(str_format(
        "{} must be a comma list of false accept rates in (0, 1], e.g. 1e-6,1e-4, got '{}'", option,
        text));
  };
  while (std::getline(items, item, ',')) {
    char* end = nullptr;
    const double far = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(far > 0.0 && far <= 1.0)) throw bad();
    fars.push_back(far);
  }
  if (fars.empty() || text.back() == ',') throw bad();
  return fars;
}

std::string python_float_text(double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  // repr's digits: the fewest that read back as `value`.
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*e", digits - 1, std::fabs(value));
    if (std::strtod(text, nullptr) == std::fabs(value)) break;
  }
  const std::string scientific(text);
  const size_t e = scientific.find('e');
  std::string digits = scientific.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exponent = value == 0.0 ? 0 : std::atoi(scientific.c_str() + e + 1);
  const std::string sign = std::signbit(value) ? "-" : "";
  // repr writes an exponent below 1e-4 and from 1e16 on, at least two of its digits.
  if (exponent < -4 || exponent >= 16) {
    const std::string mantissa =
        digits.size() == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
    return str_format("{}{}e{}{:02}", sign, mantissa, exponent < 0 ? "-" : "+", std::abs(exponent));
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole) return sign + digits + std::string(whole - digits.size(), '0') + ".0";
  return sign + digits.substr(0, whole) + "." + digits.substr(whole);
}

}  // namespace myriad
