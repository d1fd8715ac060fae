#pragma once

#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "myriad/data/image_source.h"
#include "myriad/model/backbone.h"

namespace myriad {

class Communicator;
class ShardedMarginSoftmax;

struct ClassificationEval {
  int64_t samples = 0;
  double top1 = 0.0;  // the sharded classifier's argmax over all C classes
  // Queries of kNN: the samples, among the first EvalSetup::knn_limit, whose class has another
  // one there (0: kNN has nothing to score).
  int64_t knn_queries = 0;
  double knn_top1 = 0.0;  // the label of each query's nearest other embedding (cosine)
};

struct VerificationEval {
  int64_t pairs = 0;
  double accuracy = 0.0;   // mean over the 10 folds
  double std = 0.0;        // over the folds
  double threshold = 0.0;  // mean best cosine threshold
};

// Everything evaluation needs besides the model.
struct EvalSetup {
  Communicator* comm = nullptr;  // the data plane of `device`
  torch::Device device{torch::kCPU};
  int64_t batch_size = 256;  // per rank
  // Autocast dtype for the backbone, as in training (float32 when unset).
  std::optional<torch::ScalarType> autocast;
  // kNN uses the first `knn_limit` samples of the set (the gallery is gathered on every rank).
  int64_t knn_limit = 20000;
  // Pipeline stages (docs/pipeline.md): a set is split over `replicas` (every rank of a replica
  // takes the same images), only the first stage reads images (`reads_images`), and `forward`
  // takes a batch of images through the stages: the embeddings on the last stage, [0, D]
  // elsewhere. Unset, every rank is a replica of its own and runs the backbone.
  int replicas = 0;
  int replica = 0;
  bool reads_images = true;
  std::function<torch::Tensor(const torch::Tensor& images)> forward;
};

// The raw (unnormalised) embeddings [n, D], float32 on setup.device, of images `indices` of
// `source`, and with `mirrored` those of their mirror images after them ([2n, D]). Images are
// read, decoded and normalised as training's (x / 127.5 - 1). With pipeline stages, ranks before
// the last get [0, D].
torch::Tensor embed_views(Backbone& backbone, const ImageSource& source,
                          const std::vector<int64_t>& indices, const EvalSetup& setup,
                          bool mirrored);
// embed_views in two parts, so that a caller can read the next batch while this one runs: images
// `indices` of `source` as uint8 [n, H, W, C] on the CPU (pinned where setup.device is a GPU, for
// an asynchronous copy), undefined where this rank reads no images; and their embeddings, the
// pixels normalised (and mirrored) on setup.device rather than by the host.
torch::Tensor read_pixels(const ImageSource& source, const std::vector<int64_t>& indices,
                          const EvalSetup& setup);
torch::Tensor embed_pixels(Backbone& backbone, const torch::Tensor& pixels, const EvalSetup& setup,
                           bool mirrored);
// embed_views' embeddings [n, D], those of the mirror images added when `add_mirrored`
// (insightface's flip test-time augmentation).
torch::Tensor embed_images(Backbone& backbone, const ImageSource& source,
                           const std::vector<int64_t>& indices, const EvalSetup& setup,
                           bool add_mirrored);

// This rank's (or its replica's) balanced slice of a set of `size` images, and how many batches
// every rank runs (the same on all ranks, since each batch contains a collective).
struct EvalSlice {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t batches = 0;
};
EvalSlice eval_slice(int64_t size, const EvalSetup& setup);
// The image indices of batch `batch` of `slice` (empty once this rank's slice is done).
std::vector<int64_t> eval_batch(const EvalSlice& slice, int64_t batch, int64_t batch_size);

// Top-1 of the classifier and kNN top-1 of the embeddings on a labelled set. Each rank
// evaluates a balanced slice; collective. The backbone must be in eval mode.
ClassificationEval evaluate_classification(Backbone& backbone, ShardedMarginSoftmax& classifier,
                                           const ImageSource& data, const EvalSetup& setup);

// 10-fold verification accuracy on pairs (images 2i and 2i+1, `issame[i]`), the LFW protocol:
// embeddings of each image and of its mirror image are summed and normalised; for each fold
// the cosine threshold that is best on the other nine folds is applied to it. Collective.
VerificationEval evaluate_verification(Backbone& backbone, const ImageSource& images,
                                       const std::vector<bool>& issame, const EvalSetup& setup);

// The cosine similarity of each pair of rows 2i and 2i + 1 of L2-normalised `embeddings` [2P, D]:
// [P].
torch::Tensor pair_similarity(const torch::Tensor& embeddings);

// The 10-fold protocol on given similarities.
VerificationEval ten_fold_accuracy(const torch::Tensor& similarity,
                                   const std::vector<bool>& issame);

// `issame` of a pairs file (docs/data-format.md); an Error when the file does not match its images.
std::vector<bool> read_pair_labels(const std::string& path, int64_t images);

}  // namespace myriad
