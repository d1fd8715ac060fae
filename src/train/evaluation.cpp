#include "myriad/train/evaluation.h"

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "myriad/classifier/class_partition.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/communicator.h"
#include "myriad/util/autocast.h"
#include "myriad/util/balanced_split.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {

namespace {

double sum_over_ranks(double value, Communicator& comm) {
  torch::Tensor t = torch::full({1}, value, torch::dtype(torch::kFloat64).device(comm.device()));
  comm.all_reduce(t, ReduceOp::kSum);
  return t.item<double>();
}

}  // namespace

torch::Tensor read_pixels(const ImageSource& source, const std::vector<int64_t>& indices,
                          const EvalSetup& setup) {
  if (!setup.reads_images) return {};
  const DatasetInfo& info = source.info();
  const auto options = torch::dtype(torch::kUInt8).pinned_memory(setup.device.is_cuda());
  torch::Tensor pixels = torch::empty(
      {static_cast<int64_t>(indices.size()), info.height, info.width, info.channels}, options);
  source.read(indices, pixels.data_ptr<uint8_t>());
  return pixels;
}

torch::Tensor embed_pixels(Backbone& backbone, const torch::Tensor& pixels, const EvalSetup& setup,
                           bool mirrored) {
  torch::Tensor images;
  if (pixels.defined()) {
    // As normalize_image computes it (x * (1 / 127.5) - 1, in float), so that both agree exactly.
    images = pixels.to(setup.device, /*non_blocking=*/true)
                 .permute({0, 3, 1, 2})
                 .to(torch::kFloat32)
                 .mul_(1.0f / 127.5f)
                 .sub_(1.0f)
                 .contiguous();
    if (mirrored) images = torch::cat({images, images.flip({3})});
  }
  torch::NoGradGuard no_grad;
  torch::Tensor features;
  if (setup.forward) {
    features = setup.forward(images);
  } else {
    const AutocastGuard autocast(setup.device, setup.autocast);
    features = backbone.forward(backbone.in_layout(images));
  }
  return features.to(torch::kFloat32);
}

torch::Tensor embed_views(Backbone& backbone, const ImageSource& source,
                          const std::vector<int64_t>& indices, const EvalSetup& setup,
                          bool mirrored) {
  return embed_pixels(backbone, read_pixels(source, indices, setup), setup, mirrored);
}

torch::Tensor embed_images(Backbone& backbone, const ImageSource& source,
                           const std::vector<int64_t>& indices, const EvalSetup& setup,
                           bool add_mirrored) {
  const torch::Tensor features = embed_views(backbone, source, indices, setup, add_mirrored);
  const int64_t n = static_cast<int64_t>(indices.size());
  if (add_mirrored && features.size(0) == 2 * n)
    return features.narrow(0, 0, n) + features.narrow(0, n, n);
  return features;
}

EvalSlice eval_slice(int64_t size, const EvalSetup& setup) {
  const int world = setup.replicas > 0 ? setup.replicas : setup.comm->size();
  const int rank = setup.replicas > 0 ? setup.replica : setup.comm->rank();
  const std::vector<int64_t> counts = balanced_counts(size, world);
  EvalSlice s;
  s.begin = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
  s.count = counts[rank];
  s.batches = (counts[0] + setup.batch_size - 1) / setup.batch_size;
  return s;
}

std::vector<int64_t> eval_batch(const EvalSlice& s, int64_t batch, int64_t batch_size) {
  std::vector<int64_t> indices;
  for (int64_t i = batch * batch_size; i < std::min(s.count, (batch + 1) * batch_size); ++i)
    indices.push_back(s.begin + i);
  return indices;
}

ClassificationEval evaluate_classification(Backbone& backbone, ShardedMarginSoftmax& classifier,
                                           const ImageSource& data, const EvalSetup& setup) {
  const int64_t dim = classifier.options().embedding_size;
  const EvalSlice slice = eval_slice(data.info().size, setup);
  double correct = 0;
  std::vector<torch::Tensor> knn_features;
  std::vector<int64_t> knn_labels;
  for (int64_t b = 0; b < slice.batches; ++b) {
    const std::vector<int64_t> indices = eval_batch(slice, b, setup.batch_size);
    torch::Tensor features = indices.empty() ? torch::empty({0, dim}, torch::device(setup.device))
                                             : embed_images(backbone, data, indices, setup, false);
    const torch::Tensor predicted = classifier.predict(features).to(torch::kCPU, torch::kInt64);
    const int64_t* predicted_class = predicted.data_ptr<int64_t>();
    // Past the last pipeline stage's ranks the batch has no embeddings: they score nothing.
    const size_t rows = static_cast<size_t>(features.size(0));
    for (size_t i = 0; i < rows; ++i) {
      const int64_t label = data.label(indices[i]);
      correct += predicted_class[i] == label ? 1 : 0;
      if (indices[i] < setup.knn_limit) {
        knn_features.push_back(features[static_cast<int64_t>(i)]);
        knn_labels.push_back(label);
      }
    }
  }
  ClassificationEval result;
  result.samples = data.info().size;
  result.top1 = sum_over_ranks(correct, *setup.comm) / static_cast<double>(result.samples);

  // kNN top-1 over the first knn_limit samples: every rank gathers them all as the gallery and
  // scores its own ones as queries. A sample whose class has no other sample in the gallery has
  // no right answer (a held-out set of one view per class has none at all): it is no query.
  const auto f32 = torch::dtype(torch::kFloat32).device(setup.device);
  torch::Tensor mine =
      knn_features.empty() ? torch::empty({0, dim}, f32) : torch::stack(knn_features);
  mine = mine / mine.norm(2, 1, true).clamp_min(1e-12);
  const torch::Tensor my_labels =
      torch::tensor(knn_labels, torch::kInt64).reshape({-1}).to(setup.device);
  const std::vector<int64_t> counts = setup.comm->all_gather_counts(mine.size(0));
  const torch::Tensor gallery = setup.comm->all_gather(mine, counts);
  const torch::Tensor gallery_labels = setup.comm->all_gather(my_labels, counts);
  double knn_correct = 0, knn_queries = 0;
  if (mine.size(0) > 0) {
    const torch::Tensor sorted = std::get<0>(gallery_labels.sort());
    const torch::Tensor same_class = torch::searchsorted(sorted, my_labels, false, true) -
                                     torch::searchsorted(sorted, my_labels);
    const torch::Tensor query = same_class.gt(1);
    const int64_t first =
        std::accumulate(counts.begin(), counts.begin() + setup.comm->rank(), int64_t{0});
    torch::Tensor similarity = mine.matmul(gallery.t());
    similarity.diagonal(first).fill_(-std::numeric_limits<float>::infinity());
    const torch::Tensor nearest = gallery_labels.index_select(0, similarity.argmax(1));
    knn_correct = nearest.eq(my_labels).logical_and_(query).sum().item<double>();
    knn_queries = query.sum().item<double>();
  }
  result.knn_queries = static_cast<int64_t>(sum_over_ranks(knn_queries, *setup.comm));
  const double knn_total = sum_over_ranks(knn_correct, *setup.comm);
  if (result.knn_queries > 0) result.knn_top1 = knn_total / static_cast<double>(result.knn_queries);
  return result;
}

VerificationEval ten_fold_accuracy(const torch::Tensor& similarity,
                                   const std::vector<bool>& issame) {
  const int64_t pairs = similarity.size(0);
  MYRIAD_CHECK(
      pairs == static_cast<int64_t>(issame.size()) && pairs >= 10,
      "verification needs at least 10 pairs with a label each, got {} similarities and {} labels",
      pairs, issame.size());
  const torch::Tensor sim = similarity.to(torch::kFloat64).cpu().contiguous();
  const double* s = sim.data_ptr<double>();
  auto accuracy = [&](int64_t begin, int64_t end, double threshold, bool skip_fold,
                      int64_t fold_begin, int64_t fold_end) {
    int64_t right = 0, total = 0;
    for (int64_t i = begin; i < end; ++i) {
      const bool in_fold = i >= fold_begin && i < fold_end;
      if (skip_fold == in_fold) continue;
      right += ((s[i] > threshold) == issame[i]) ? 1 : 0;
      ++total;
    }
    return total == 0 ? 0.0 : static_cast<double>(right) / static_cast<double>(total);
  };
  VerificationEval result;
  result.pairs = pairs;
  std::vector<double> fold_accuracy;
  for (int fold = 0; fold < 10; ++fold) {
    const int64_t fold_begin = pairs * fold / 10, fold_end = pairs * (fold + 1) / 10;
    double best = -1.0, best_threshold = 0.0;
    for (int t = 0; t <= 400; ++t) {
      const double threshold = -1.0 + 0.005 * t;
      const double acc = accuracy(0, pairs, threshold, true, fold_begin, fold_end);
      if (acc > best) {
        best = acc;
        best_threshold = threshold;
      }
    }
    fold_accuracy.push_back(accuracy(0, pairs, best_threshold, false, fold_begin, fold_end));
    result.threshold += best_threshold / 10.0;
  }
  for (double a : fold_accuracy) result.accuracy += a / 10.0;
  for (double a : fold_accuracy) result.std += (a - result.accuracy) * (a - result.accuracy) / 10.0;
  result.std = std::sqrt(result.std);
  return result;
}

VerificationEval evaluate_verification(Backbone& backbone, const ImageSource& images,
                                       const std::vector<bool>& issame, const EvalSetup& setup) {
  MYRIAD_CHECK(images.info().size == 2 * static_cast<int64_t>(issame.size()),
               "{} has {} images for {} pairs", images.info().name, images.info().size,
               issame.size());
  const EvalSlice slice = eval_slice(images.info().size, setup);
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < slice.batches; ++b) {
    const std::vector<int64_t> indices = eval_batch(slice, b, setup.batch_size);
    if (indices.empty()) continue;
    const torch::Tensor features = embed_images(backbone, images, indices, setup, true);
    if (features.size(0) > 0) parts.push_back(features);
  }
  const int64_t dim = parts.empty() ? 0 : parts[0].size(1);
  const std::vector<int64_t> dims = setup.comm->all_gather_counts(dim);
  const int64_t width = *std::max_element(dims.begin(), dims.end());
  torch::Tensor mine =
      parts.empty() ? torch::empty({0, width}, torch::device(setup.device)) : torch::cat(parts);
  const torch::Tensor all =
      setup.comm->all_gather(mine, setup.comm->all_gather_counts(mine.size(0)));
  const torch::Tensor unit = all / all.norm(2, 1, true).clamp_min(1e-12);
  return ten_fold_accuracy(pair_similarity(unit), issame);
}

torch::Tensor pair_similarity(const torch::Tensor& embeddings) {
  const torch::Tensor pairs = embeddings.reshape({-1, 2, embeddings.size(1)});
  return (pairs.select(1, 0) * pairs.select(1, 1)).sum(1);
}

std::vector<bool> read_pair_labels(const std::string& path, int64_t images) {
  const Hdf5File file(path, Hdf5File::Mode::kRead);
  MYRIAD_CHECK(file.has("issame"), "'{}' is not a verification pairs file: it has no /issame",
               path);
  const torch::Tensor issame = file.read("issame").to(torch::kInt64).reshape({-1}).contiguous();
  MYRIAD_CHECK(issame.numel() * 2 == images, "'{}': {} pairs need {} images, the file has {}", path,
               issame.numel(), issame.numel() * 2, images);
  const int64_t* same = issame.data_ptr<int64_t>();
  return std::vector<bool>(same, same + issame.numel());
}

}  // namespace myriad
