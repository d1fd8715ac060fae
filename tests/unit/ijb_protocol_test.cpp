// insightface's IJB protocol (ijb_protocol.h, ijb_set.h) against a float64 reference written out
// here from eval_ijbc.py and scikit-learn's roc_curve: image2template_feature's loops, and a ROC
// that counts the true and false positives at or above each distinct score directly.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "myriad/train/ijb_protocol.h"
#include "myriad/train/ijb_set.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using Vector = std::vector<double>;

// A small IJB-like set: images in templates of several medias, raw and mirrored embeddings and
// detector scores.
struct Images {
  std::vector<int64_t> templates;
  std::vector<int64_t> medias;
  torch::Tensor raw;       // float32 [N, D]
  torch::Tensor mirrored;  // float32 [N, D]
  torch::Tensor scores;    // float32 [N]
};

Images make_images(int64_t n, int64_t dim, uint64_t seed, int64_t templates = 6) {
  torch::manual_seed(seed);
  Images images;
  // Template ids out of order and far apart; a few medias per template, some of one image.
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < templates; ++j) ids.push_back(j * 7919 % 10007);
  const torch::Tensor draw = torch::randint(0, 1000, {n, 2}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    images.templates.push_back(ids[static_cast<size_t>(draw[i][0].item<int64_t>() % templates)]);
    images.medias.push_back(500 + draw[i][1].item<int64_t>() % 4);
  }
  images.raw = torch::randn({n, dim});
  images.mirrored = 0.5 * images.raw + torch::randn({n, dim});
  images.scores = 0.3 + 0.7 * torch::rand({n});
  return images;
}

// eval_ijbc.py's image features, one image at a time.
std::vector<Vector> reference_image_features(const Images& images, const IjbFeatureOptions& o) {
  const auto raw = images.raw.accessor<float, 2>();
  const auto mirrored = images.mirrored.accessor<float, 2>();
  std::vector<Vector> features;
  for (int64_t i = 0; i < raw.size(0); ++i) {
    Vector f(raw.size(1));
    for (int64_t k = 0; k < raw.size(1); ++k) f[k] = raw[i][k] + (o.flip ? mirrored[i][k] : 0.0);
    if (o.normalize_images) {
      const double norm = std::sqrt(std::inner_product(f.begin(), f.end(), f.begin(), 0.0));
      for (double& x : f) x /= norm;
    }
    const double score = o.detector_score ? images.scores[i].item<float>() : 1.0;
    for (double& x : f) x *= score;
    features.push_back(f);
  }
  return features;
}

Vector normalized(Vector v) {
  const double norm = std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0));
  if (norm > 0) {
    for (double& x : v) x /= norm;
  }
  return v;
}

// image2template_feature: per template (ascending), each media's images averaged, the medias
// summed, the sum normalised.
std::map<int64_t, Vector> reference_templates(const Images& images,
                                              const std::vector<Vector>& features) {
  std::map<int64_t, std::map<int64_t, std::vector<size_t>>> groups;
  for (size_t i = 0; i < features.size(); ++i)
    groups[images.templates[i]][images.medias[i]].push_back(i);
  std::map<int64_t, Vector> templates;
  for (const auto& [id, medias] : groups) {
    Vector sum(features[0].size(), 0.0);
    for (const auto& [media, members] : medias) {
      for (size_t i : members) {
        for (size_t k = 0; k < sum.size(); ++k) sum[k] += features[i][k] / members.size();
      }
    }
    templates[id] = normalized(sum);
  }
  return templates;
}

// The pool's features of `images`, added in three uneven parts as batches would arrive.
torch::Tensor pooled(const Images& images, const IjbFeatureOptions& o, torch::Tensor* ids) {
  const auto [template_ids, rows] = template_rows(torch::tensor(images.templates));
  TemplatePool pool(template_ids.size(0), rows, media_weights(rows, torch::tensor(images.medias)),
                    images.raw.size(1), torch::kCPU);
  const int64_t n = images.raw.size(0);
  for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{
           {0, n / 3}, {n / 3, n / 2 - n / 3}, {n / 2, n - n / 2}}) {
    pool.add(first, ijb_image_features(images.raw.narrow(0, first, count),
                                       images.mirrored.narrow(0, first, count),
                                       images.scores.narrow(0, first, count), o));
  }
  if (ids != nullptr) *ids = template_ids;
  return pool.normalized();
}

double max_difference(const torch::Tensor& features, const torch::Tensor& ids,
                      const std::map<int64_t, Vector>& reference) {
  EXPECT_EQ(ids.size(0), static_cast<int64_t>(reference.size()));
  double worst = 0.0;
  int64_t row = 0;
  for (const auto& [id, expected] : reference) {
    EXPECT_EQ(ids[row].item<int64_t>(), id);
    for (size_t k = 0; k < expected.size(); ++k) {
      worst = std::max(
          worst, std::abs(features[row][static_cast<int64_t>(k)].item<double>() - expected[k]));
    }
    ++row;
  }
  return worst;
}

std::vector<IjbFeatureOptions> every_option() {
  std::vector<IjbFeatureOptions> all;
  for (int bits = 0; bits < 8; ++bits)
    all.push_back({(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0});
  return all;
}

TEST(IjbProtocol, PoolingMatchesTheReferenceUnderEverySwitch) {
  const Images images = make_images(80, 6, 1);
  for (const IjbFeatureOptions& o : every_option()) {
    torch::Tensor ids;
    const torch::Tensor features = pooled(images, o, &ids);
    const auto reference = reference_templates(images, reference_image_features(images, o));
    EXPECT_LT(max_difference(features, ids, reference), 1e-12)
        << "flip " << o.flip << ", detector score " << o.detector_score << ", normalize images "
        << o.normalize_images;
  }
}

// Each switch changes the templates, and as the reference says: its features under the switch
// turned over are those of the reference with the switch turned over, not the original ones.
TEST(IjbProtocol, EachSwitchChangesTheTemplatesAsTheReferenceSays) {
  const Images images = make_images(80, 6, 2);
  const IjbFeatureOptions defaults;
  torch::Tensor ids;
  const torch::Tensor base = pooled(images, defaults, &ids);
  for (int which = 0; which < 3; ++which) {
    IjbFeatureOptions o = defaults;
    bool& flag = which == 0 ? o.flip : which == 1 ? o.detector_score : o.normalize_images;
    flag = !flag;
    const torch::Tensor changed = pooled(images, o, nullptr);
    const auto reference = reference_templates(images, reference_image_features(images, o));
    EXPECT_LT(max_difference(changed, ids, reference), 1e-12) << "switch " << which;
    EXPECT_GT((changed - base).abs().max().item<double>(), 1e-3) << "switch " << which;
  }
  // Without the detector score the scores do not matter; with it, an image of score 0 adds
  // nothing to its media's average, in which it still counts (as in image2template_feature).
  Images zeroed = images;
  zeroed.scores = images.scores.clone();
  zeroed.scores[0] = 0.0f;
  IjbFeatureOptions no_score;
  no_score.detector_score = false;
  EXPECT_TRUE(torch::equal(pooled(zeroed, no_score, nullptr), pooled(images, no_score, nullptr)));
  const auto reference = reference_templates(zeroed, reference_image_features(zeroed, defaults));
  EXPECT_LT(max_difference(pooled(zeroed, defaults, nullptr), ids, reference), 1e-12);
}

TEST(IjbProtocol, AZeroTemplateStaysZero) {
  Images images = make_images(10, 4, 3);
  images.scores.zero_();
  const torch::Tensor features = pooled(images, IjbFeatureOptions(), nullptr);
  EXPECT_EQ(features.abs().sum().item<double>(), 0.0);
}

TEST(IjbProtocol, PairRowsNameTheTemplateWithoutImages) {
  const torch::Tensor ids = torch::tensor({3, 10, 40}, torch::kInt64);
  const torch::Tensor rows = pair_rows(ids, torch::tensor({3, 40, 10, 10}).view({2, 2}), "x.h5");
  EXPECT_TRUE(torch::equal(rows, torch::tensor({0, 2, 1, 1}, torch::kInt64).view({2, 2})));
  EXPECT_EQ(testing::error_of([&] {
              pair_rows(ids, torch::tensor({3, 40, 10, 41}).view({2, 2}), "x.h5");
            }),
            "'x.h5': pair 1 names template 41, which has no image");
  EXPECT_EQ(testing::error_of([&] {
              pair_rows(ids, torch::tensor({2, 40}).view({1, 2}), "x.h5");
            }),
            "'x.h5': pair 0 names template 2, which has no image");
}

TEST(IjbProtocol, PairScoresAreTheTemplatesCosinesInAnyBatch) {
  torch::manual_seed(4);
  const torch::Tensor features = torch::randn({9, 5}, torch::kFloat64);
  const torch::Tensor rows = torch::randint(0, 9, {50, 2}, torch::kInt64);
  for (int64_t batch : {0, 1, 7, 50, 64}) {
    const torch::Tensor scores = pair_scores(features, rows, batch);
    for (int64_t p = 0; p < 50; ++p) {
      double dot = 0.0;
      for (int64_t k = 0; k < 5; ++k) {
        dot += features[rows[p][0].item<int64_t>()][k].item<double>() *
               features[rows[p][1].item<int64_t>()][k].item<double>();
      }
      EXPECT_NEAR(scores[p].item<double>(), dot, 1e-12) << "batch " << batch;
    }
  }
}

struct ReferenceRoc {
  Vector fpr, tpr;
};

// roc_curve(labels, scores) as scikit-learn defines it, counted directly: one point per distinct
// score, highest first, with the pairs at or above it; points whose neighbours' counts lie on a
// straight line through it dropped (drop_intermediate); (0, 0) first.
ReferenceRoc reference_roc(const Vector& scores, const std::vector<int>& labels) {
  Vector thresholds = scores;
  std::sort(thresholds.begin(), thresholds.end(), std::greater<double>());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  std::vector<double> tp, fp;
  for (double t : thresholds) {
    double genuine = 0, impostor = 0;
    for (size_t i = 0; i < scores.size(); ++i) {
      if (scores[i] >= t) (labels[i] == 1 ? genuine : impostor) += 1;
    }
    tp.push_back(genuine);
    fp.push_back(impostor);
  }
  ReferenceRoc roc{{0.0}, {0.0}};
  const size_t k = tp.size();
  for (size_t i = 0; i < k; ++i) {
    const bool straight = i > 0 && i + 1 < k && k > 2 && fp[i + 1] - 2 * fp[i] + fp[i - 1] == 0 &&
                          tp[i + 1] - 2 * tp[i] + tp[i - 1] == 0;
    if (straight) continue;
    roc.fpr.push_back(fp[i] / fp.back());
    roc.tpr.push_back(tp[i] / tp.back());
  }
  return roc;
}

// eval_ijbc.py: fpr and tpr reversed, then min(zip(abs(fpr - far), range(len(fpr)))).
double reference_tar(const ReferenceRoc& roc, double far) {
  const Vector fpr(roc.fpr.rbegin(), roc.fpr.rend()), tpr(roc.tpr.rbegin(), roc.tpr.rend());
  size_t best = 0;
  for (size_t i = 1; i < fpr.size(); ++i) {
    if (std::abs(fpr[i] - far) < std::abs(fpr[best] - far)) best = i;
  }
  return tpr[best];
}

Vector as_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat64).contiguous();
  return Vector(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

void expect_roc(const Vector& scores, const std::vector<int>& labels) {
  const Roc roc = roc_curve(torch::tensor(labels), torch::tensor(scores, torch::kFloat64));
  const ReferenceRoc reference = reference_roc(scores, labels);
  EXPECT_EQ(as_vector(roc.fpr), reference.fpr);
  EXPECT_EQ(as_vector(roc.tpr), reference.tpr);
  EXPECT_EQ(roc.genuine, std::count(labels.begin(), labels.end(), 1));
  EXPECT_EQ(roc.impostors, std::count(labels.begin(), labels.end(), 0));
  for (double far : {1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0}) {
    EXPECT_NEAR(tar_at_far(roc, {far})[0].tar, reference_tar(reference, far), 1e-12) << far;
  }
}

TEST(IjbProtocol, RocMatchesTheDirectCountWithAndWithoutTies) {
  torch::manual_seed(5);
  for (double step : {0.0, 0.01, 0.1, 0.5}) {  // 0: distinct scores; else ties on a grid
    const torch::Tensor u = torch::rand({400}, torch::kFloat64);
    const torch::Tensor labels = torch::rand({400}).lt(0.3).to(torch::kInt32);
    torch::Tensor scores = u + 0.4 * labels;
    if (step > 0) scores = (scores / step).round() * step;
    const torch::Tensor l = labels.contiguous();
    expect_roc(as_vector(scores), std::vector<int>(l.data_ptr<int>(), l.data_ptr<int>() + 400));
  }
}

TEST(IjbProtocol, DropIntermediateKeepsTheCornersOnly) {
  // Counts (tp, fp) at the five thresholds: (1,0) (2,0) (3,0) (3,1) (3,2): (2,0) lies between
  // (1,0) and (3,0), and (3,1) between (3,0) and (3,2).
  const Roc roc = roc_curve(torch::tensor({1, 1, 1, 0, 0}),
                            torch::tensor({0.9, 0.8, 0.7, 0.6, 0.5}, torch::kFloat64));
  EXPECT_EQ(as_vector(roc.fpr), (Vector{0.0, 0.0, 0.0, 1.0}));
  EXPECT_EQ(as_vector(roc.tpr), (Vector{0.0, 1.0 / 3, 1.0, 1.0}));
  EXPECT_EQ(as_vector(roc.thresholds),
            (Vector{std::numeric_limits<double>::infinity(), 0.9, 0.7, 0.5}));
  // Two points only are kept whole; a tie counts its pairs together.
  const Roc two =
      roc_curve(torch::tensor({1, 0, 1}), torch::tensor({0.5, 0.5, 0.2}, torch::kFloat64));
  EXPECT_EQ(as_vector(two.fpr), (Vector{0.0, 1.0, 1.0}));
  EXPECT_EQ(as_vector(two.tpr), (Vector{0.0, 0.5, 1.0}));
}

TEST(IjbProtocol, NonFiniteScoresAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(testing::error_of([&] {
              roc_curve(torch::tensor({1, 0, 1}), torch::tensor({0.5, nan, 0.2}, torch::kFloat64));
            }),
            "1 of 3 pair scores are not finite: the backbone's embeddings of some images are not "
            "(a diverged model, or a precision that overflowed)");
}

TEST(IjbProtocol, TarAtFarTakesTheLastNearestPoint) {
  // Three points at fpr 0: insightface reads the one of the largest tpr.
  const Roc vertical = roc_curve(torch::tensor({1, 1, 1, 0, 0}),
                                 torch::tensor({0.9, 0.8, 0.7, 0.6, 0.5}, torch::kFloat64));
  const TarAtFar at = tar_at_far(vertical, {1e-6})[0];
  EXPECT_EQ(at.tar, 1.0);
  EXPECT_EQ(at.fpr, 0.0);
  EXPECT_EQ(at.threshold, 0.7);
  // fpr 0.25 and 0.75 lie equally far from 0.5: the later point, of fpr 0.75.
  Roc roc;
  roc.fpr = torch::tensor({0.0, 0.25, 0.75, 1.0}, torch::kFloat64);
  roc.tpr = torch::tensor({0.0, 0.5, 0.8, 1.0}, torch::kFloat64);
  roc.thresholds = torch::tensor({9.0, 0.6, 0.4, 0.1}, torch::kFloat64);
  const std::vector<TarAtFar> points = tar_at_far(roc, {0.5, 0.3, 2e-1});
  EXPECT_EQ(points[0].tar, 0.8);
  EXPECT_EQ(points[0].threshold, 0.4);
  EXPECT_EQ(points[1].tar, 0.5);
  EXPECT_EQ(points[2].tar, 0.5);
  EXPECT_EQ(points[2].far, 0.2);
}

TEST(IjbProtocol, AFarBelowOneImpostorIsRefused) {
  EXPECT_NO_THROW(check_far_reachable({1e-6, 1e-3}, 1000000, "ijbc.h5"));
  EXPECT_NO_THROW(check_far_reachable({1e-3, 0.1}, 1000, "ijbc.h5"));
  EXPECT_EQ(testing::error_of([] {
              check_far_reachable({0.1, 1e-3}, 999, "ijbc.h5");
            }),
            "FAR 0.001 cannot be measured on 'ijbc.h5': it has 999 impostor pairs, and a false "
            "accept rate of 0.001 needs at least 1000 (--far sets the rates)");
  EXPECT_NE(testing::error_of([] { check_far_reachable({1e-6}, 999999, "ijbc.h5"); }), "");
}

TEST(IjbProtocol, FarListsAndPythonsSpelling) {
  EXPECT_EQ(parse_far_list(kIjbFars, "--far"),
            (std::vector<double>{1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1}));
  EXPECT_EQ(parse_far_list("0.5", "--far"), std::vector<double>{0.5});
  for (const char* bad :
       {"", "0", "1e-6,", ",0.1", "2", "-0.1", "1e-6;1e-5", "x", "nan", "0.1,,0.2"})
    EXPECT_THROW(parse_far_list(bad, "--far"), UsageError) << bad;
  const std::vector<std::pair<double, std::string>> spelt = {
      {1e-6, "1e-06"},     {1e-5, "1e-05"},      {1e-4, "0.0001"}, {1e-3, "0.001"},
      {0.01, "0.01"},      {0.1, "0.1"},         {1.0, "1.0"},     {2.5e-7, "2.5e-07"},
      {0.3, "0.3"},        {123.456, "123.456"}, {1e16, "1e+16"},  {1e15, "1000000000000000.0"},
      {1.5e-5, "1.5e-05"}, {0.00012, "0.00012"}, {0.0, "0.0"}};
  for (const auto& [value, text] : spelt) EXPECT_EQ(python_float_text(value), text);
}

// The whole protocol on a small set: templates pooled, pairs scored and TAR read, against the
// reference's chain of its own.
TEST(IjbProtocol, TarAtFarOfASetMatchesTheReference) {
  const Images images = make_images(120, 8, 6, 40);
  const IjbFeatureOptions o;
  torch::Tensor ids;
  const torch::Tensor features = pooled(images, o, &ids);
  const auto reference = reference_templates(images, reference_image_features(images, o));
  torch::manual_seed(7);
  const int64_t pairs = 3000;
  // No template with itself: its cosine of 1 may round either way in either chain.
  const torch::Tensor first = torch::randint(0, ids.size(0), {pairs}, torch::kInt64);
  const torch::Tensor other =
      (first + torch::randint(1, ids.size(0), {pairs}, torch::kInt64)) % ids.size(0);
  const torch::Tensor rows = torch::stack({first, other}, 1);
  const torch::Tensor scores = pair_scores(features, rows, 256);
  Vector expected_scores;
  std::vector<int> labels;
  for (int64_t p = 0; p < pairs; ++p) {
    const Vector& a = reference.at(ids[rows[p][0].item<int64_t>()].item<int64_t>());
    const Vector& b = reference.at(ids[rows[p][1].item<int64_t>()].item<int64_t>());
    expected_scores.push_back(std::inner_product(a.begin(), a.end(), b.begin(), 0.0));
    labels.push_back(expected_scores.back() > 0.2 ? p % 5 != 0 : p % 7 == 0);
  }
  EXPECT_LT((scores - torch::tensor(expected_scores, torch::kFloat64)).abs().max().item<double>(),
            1e-12);
  const Roc roc = roc_curve(torch::tensor(labels), scores);
  const ReferenceRoc reference_curve = reference_roc(expected_scores, labels);
  for (double far : {1e-3, 1e-2, 1e-1}) {
    EXPECT_NEAR(tar_at_far(roc, {far})[0].tar, reference_tar(reference_curve, far), 1e-6) << far;
  }
}

// --- the file ---------------------------------------------------------------------------------

// A valid file of 6 images in templates 5 and 9, and 4 pairs; `edit` changes it before writing.
std::string write_set(const std::string& name,
                      const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
  std::map<std::string, torch::Tensor> data = {
      {"images", torch::zeros({6, 4, 4, 3}, torch::kUInt8)},
      {"templates", torch::tensor({5, 5, 9, 9, 9, 5}, torch::kInt64)},
      {"medias", torch::tensor({1, 1, 2, 3, 3, 4}, torch::kInt64)},
      {"scores", torch::tensor({0.9f, 0.8f, 0.99f, 0.7f, 0.6f, 0.5f})},
      {"pairs", torch::tensor({5, 9, 9, 9, 5, 5, 9, 5}, torch::kInt64).view({4, 2})},
      {"pair_labels", torch::tensor({0, 1, 1, 0}, torch::kUInt8)}};
  edit(data);
  const std::string path = testing::temp_file(name);
  Hdf5File file(path, Hdf5File::Mode::kCreate);
  for (const auto& [key, tensor] : data) file.write(key, tensor);
  file.set_attribute("/", "ijb_target", std::string("IJBC"));
  return path;
}

TEST(IjbSet, ReadsAndIndexesAValidFile) {
  const IjbSet set = read_ijb_set(write_set("ijb-good.h5", [](auto&) {}));
  EXPECT_EQ(set.target, "IJBC");
  EXPECT_EQ(set.images(), 6);
  EXPECT_EQ(set.pairs(), 4);
  EXPECT_EQ(set.genuine, 2);
  EXPECT_EQ(set.impostors, 2);
  EXPECT_TRUE(torch::equal(set.template_ids, torch::tensor({5, 9}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(set.image_rows, torch::tensor({0, 0, 1, 1, 1, 0}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(set.pair_rows,
                           torch::tensor({0, 1, 1, 1, 0, 0, 1, 0}, torch::kInt64).view({4, 2})));
  // Media 1 of template 5 and media 3 of template 9 have two images each: half a weight each.
  EXPECT_TRUE(torch::equal(media_weights(set.image_rows, set.medias),
                           torch::tensor({0.5, 0.5, 1.0, 0.5, 0.5, 1.0}, torch::kFloat64)));
}

TEST(IjbSet, EveryFaultIsOneError) {
  const std::vector<
      std::pair<std::function<void(std::map<std::string, torch::Tensor>&)>, std::string>>
      cases = {
          {[](auto& d) { d.erase("scores"); },
           "' is not an IJB evaluation file: it has no /scores (docs/data-format.md; myriad-data "
           "from-ijb writes them)"},
          {[](auto& d) { d["medias"] = d["medias"].narrow(0, 0, 5); },
           "': /medias is shaped [5], where /images and /pairs need [6]"},
          {[](auto& d) { d["pair_labels"] = torch::ones({3}, torch::kUInt8); },
           "': /pair_labels is shaped [3], where /images and /pairs need [4]"},
          {[](auto& d) {
             d["pairs"] = torch::zeros({4, 3}, torch::kInt64);
           },
           "': /pairs is shaped [4, 3]; it holds two template ids per pair, [P, 2]"},
          {[](auto& d) { d["templates"] = d["templates"].to(torch::kFloat32); },
           "': /templates holds Float; it must hold integers"},
          {[](auto& d) { d["scores"][3] = std::nanf(""); },
           "': /scores[3] is nan: detector scores must be finite"},
          {[](auto& d) { d["pair_labels"][2] = 2; },
           "': /pair_labels[2] is 2: a pair's label is 1 (one identity) or 0 (two)"},
          {[](auto& d) { d["pairs"][3][0] = 7; }, "': pair 3 names template 7, which has no image"},
          {[](auto& d) { d["pair_labels"].fill_(1); },
           "' has 4 genuine pairs (label 1) and 0 impostor pairs (label 0): verification needs "
           "both"},
      };
  int i = 0;
  for (const auto& [edit, message] : cases) {
    const std::string path = write_set("ijb-bad-" + std::to_string(i++) + ".h5", edit);
    EXPECT_EQ(testing::error_of([&] { read_ijb_set(path); }), "'" + path + message);
  }
}

}  // namespace
}  // namespace myriad
