// Held-out evaluation (top-1 of the sharded classifier, kNN top-1 of the embeddings) at whatever
// rank count this binary runs with, against a single-process float64 reference.

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mpi_test.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/communicator.h"
#include "myriad/data/image_source.h"
#include "myriad/model/backbone.h"
#include "myriad/train/evaluation.h"

namespace myriad::testing {
namespace {

constexpr int kSide = 4;  // images 1 x 4 x 4, whose pixels are their embedding (D = 16)
constexpr int64_t kDim = kSide * kSide;

// Random images, the same on every rank, with the labels given.
class MemorySource : public ImageSource {
 public:
  MemorySource(std::vector<int64_t> labels, int64_t classes, uint32_t seed)
      : labels_(std::move(labels)) {
    info_.name = "memory";
    info_.size = static_cast<int64_t>(labels_.size());
    info_.num_classes = classes;
    info_.height = info_.width = kSide;
    info_.channels = 1;
    std::mt19937 random(seed);
    pixels_.resize(labels_.size() * kDim);
    for (uint8_t& p : pixels_) p = static_cast<uint8_t>(random() % 256);
  }
  const DatasetInfo& info() const override { return info_; }
  int64_t label(int64_t index) const override { return labels_[index]; }
  void read(const std::vector<int64_t>& indices, uint8_t* out) const override {
    for (int64_t index : indices) out = std::copy_n(pixels_.begin() + index * kDim, kDim, out);
  }
  // Sample `index`'s embedding as the evaluation sees it: its normalised pixels.
  std::vector<double> embedding(int64_t index) const {
    std::vector<double> e(kDim);
    for (int64_t k = 0; k < kDim; ++k) e[k] = pixels_[index * kDim + k] / 127.5 - 1.0;
    return e;
  }

 private:
  DatasetInfo info_;
  std::vector<int64_t> labels_;
  std::vector<uint8_t> pixels_;
};

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    dot += a[k] * b[k];
    aa += a[k] * a[k];
    bb += b[k] * b[k];
  }
  return dot / std::sqrt(aa * bb);
}

struct Expected {
  double top1 = 0;
  int64_t knn_queries = 0;
  double knn_top1 = 0;
};

// Brute force over the whole set: the classifier's argmax cosine, and for each of the first
// `limit` samples whose class has another there, the label of its nearest other one.
Expected reference(const MemorySource& data, const torch::Tensor& weight, int64_t limit) {
  const int64_t n = data.info().size;
  const torch::Tensor w = weight.to(torch::kFloat64).contiguous();
  Expected e;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> x = data.embedding(i);
    int64_t best = -1;
    double best_cos = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < w.size(0); ++c) {
      const double* row = w[c].data_ptr<double>();
      const double cos = cosine(x, std::vector<double>(row, row + kDim));
      if (cos > best_cos) best_cos = cos, best = c;
    }
    e.top1 += best == data.label(i) ? 1 : 0;
  }
  e.top1 /= static_cast<double>(n);
  const int64_t gallery = std::min(limit, n);
  int64_t correct = 0;
  for (int64_t i = 0; i < gallery; ++i) {
    int64_t nearest = -1;
    bool partner = false;
    double best_cos = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < gallery; ++j) {
      if (j == i) continue;
      partner = partner || data.label(j) == data.label(i);
      const double cos = cosine(data.embedding(i), data.embedding(j));
      if (cos > best_cos) best_cos = cos, nearest = j;
    }
    if (!partner) continue;
    ++e.knn_queries;
    correct += data.label(nearest) == data.label(i) ? 1 : 0;
  }
  if (e.knn_queries > 0) e.knn_top1 = static_cast<double>(correct) / e.knn_queries;
  return e;
}

class EvaluationTest : public BackendTest {
 protected:
  ClassificationEval evaluate(const MemorySource& data, int64_t limit, torch::Tensor* full_weight) {
    ShardedSoftmaxOptions o;
    o.num_classes = data.info().num_classes;
    o.embedding_size = kDim;
    o.margin.type = MarginType::kArcFace;
    o.init_std = 1.0;
    o.workspace_bytes = 3 * 1024;  // several chunks
    ShardedMarginSoftmax classifier(comm(), o, device());
    *full_weight =
        comm()
            .all_gather(classifier.weight(), comm().all_gather_counts(classifier.weight().size(0)))
            .cpu();
    BackboneOptions b;
    b.name = "smallcnn";
    b.input = {1, kSide, kSide};
    b.embedding_size = kDim;
    // Only for the signature: setup.forward stands in for it.
    const std::shared_ptr<Backbone> unused = make_backbone(b);
    EvalSetup setup;
    setup.comm = &comm();
    setup.device = device();
    setup.batch_size = 7;
    setup.knn_limit = limit;
    setup.forward = [](const torch::Tensor& images) { return images.flatten(1); };
    return evaluate_classification(*unused, classifier, data, setup);
  }
};

TEST_P(EvaluationTest, TopOneAndKnnMatchBruteForce) {
  // 23 classes of 1, 2 or 3 samples (45 in all), shuffled; kNN looks at the first 30 only.
  std::vector<int64_t> labels;
  for (int64_t k = 0; k < 23; ++k) labels.insert(labels.end(), 1 + k % 3, k);
  std::shuffle(labels.begin(), labels.end(), std::mt19937(3));
  const MemorySource data(labels, 23, 5);
  torch::Tensor weight;
  const ClassificationEval got = evaluate(data, 30, &weight);
  const Expected want = reference(data, weight, 30);
  ASSERT_GT(want.knn_queries, 0);
  ASSERT_LT(want.knn_queries, 30);  // some samples have no partner among the first 30
  EXPECT_EQ(got.samples, 45);
  EXPECT_DOUBLE_EQ(got.top1, want.top1);
  EXPECT_EQ(got.knn_queries, want.knn_queries);
  EXPECT_DOUBLE_EQ(got.knn_top1, want.knn_top1);
}

TEST_P(EvaluationTest, NoKnnWhenEveryClassHasOneSample) {
  // A held-out set of one view per class: top-1 as ever, and no kNN query at all.
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 30; ++i) labels.push_back(29 - i);
  const MemorySource data(labels, 30, 9);
  torch::Tensor weight;
  const ClassificationEval got = evaluate(data, 20000, &weight);
  EXPECT_DOUBLE_EQ(got.top1, reference(data, weight, 20000).top1);
  EXPECT_EQ(got.knn_queries, 0);
  EXPECT_EQ(got.knn_top1, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Backends, EvaluationTest, ::testing::Values("mpi", "nccl"), backend_name);

}  // namespace
}  // namespace myriad::testing
