#pragma once

#include <torch/types.h>
#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "myriad/comm/comm_factory.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/train/evaluation.h"
#include "myriad/train/train_config.h"

namespace myriad {

class ProcessContext;

// What the executables that embed images with trained weights (myriad-embed, myriad-eval) are
// told about the weights and how to run the backbone.
struct EmbedderOptions {
  std::string checkpoint;     // a checkpoint directory, or a directory of them (the newest)
  std::string init_backbone;  // instead: a torch.save state dict, with `backbone`
  std::string backbone;
  std::string input_shape = "3x112x112";
  int64_t embedding_size = 512;
  int64_t batch_size = 256;  // images per rank and batch
  Precision precision = Precision::kFp32;
  std::string device = "auto";
  int threads = 0;

  // The weights' file or directory, as logs and outputs name them.
  const std::string& weights() const { return checkpoint.empty() ? init_backbone : checkpoint; }
};

// --checkpoint, --init-backbone, --backbone, --input-shape, --embedding-size, bound to `o`.
void add_weights_options(boost::program_options::options_description& options, EmbedderOptions& o);
// Adds --batch-size, --precision, --device and --threads (bound to `o`) after the app's own
// `options`, parses the command line as parse_command_line does and checks `o`: a bad combination
// is a UsageError. False where only --help was asked for.
bool parse_embedder_command_line(int argc, char** argv,
                                 boost::program_options::options_description& options,
                                 const std::string& usage, int rank, EmbedderOptions& o);

// What one pass over a set of images does with each batch's embeddings (Embedder::run).
struct EmbeddingPass {
  // Embed each image's mirror image too (insightface's flip test).
  bool mirrored = false;
  // On every rank and its device: a batch's raw embeddings [n, D] float32 (and those of its
  // mirror images, else undefined) to the rows [n, ...] that rank 0 takes. Called with n = 0 on a
  // rank whose slice is done, for the rows' shape.
  std::function<torch::Tensor(const torch::Tensor& raw, const torch::Tensor& mirrored)> rows;
  // On rank 0, for each rank's share of each batch in image order: the rows (on the CPU) of
  // images [first, first + n).
  std::function<void(int64_t first, const torch::Tensor& rows)> take;
  // What `take` does, for the error of a rank that fails in it: "writing 'emb.h5'".
  std::string taking;
};

// A trained backbone on every rank, ready to embed: its weights read by every rank (from shared
// storage; the first rank that cannot names the error), on this rank's device (--device), in eval
// mode, in the layout training takes there, with the evaluation setup of that device.
class Embedder {
 public:
  Embedder(ProcessContext& context, const EmbedderOptions& options);
  Embedder(const Embedder&) = delete;
  Embedder& operator=(const Embedder&) = delete;

  Backbone& backbone() { return *backbone_; }
  const BackboneOptions& backbone_options() const { return backbone_options_; }
  const torch::Device& device() const { return setup_.device; }
  Precision precision() const { return precision_; }

  // `path` opened on every rank, labelled when it has /labels; an error on every rank when its
  // images are not of the backbone's input shape.
  std::shared_ptr<Hdf5ImageDataset> open_data(const std::string& path) const;

  // Every rank embeds its balanced slice of `data` (eval_slice), batch by batch, and rank 0 takes
  // the rows of every batch as it arrives (so memory stays bounded), with a progress bar.
  // Collective. Returns the seconds it took.
  double run(const ImageSource& data, const EmbeddingPass& pass);

 private:
  ProcessContext& context_;
  BackboneOptions backbone_options_;
  std::shared_ptr<Backbone> backbone_;
  Precision precision_ = Precision::kFp32;
  CommFactory comms_;
  EvalSetup setup_;
};

}  // namespace myriad
