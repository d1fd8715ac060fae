#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "myriad/model/batch_norm.h"
#include "myriad/util/state_dict.h"

namespace myriad {

class OnnxGraph;

struct InputShape {
  int64_t channels = 3;
  int64_t height = 112;
  int64_t width = 112;
};

// "3x112x112" (channels x height x width); anything else is a UsageError.
InputShape parse_input_shape(const std::string& text);

struct BackboneOptions {
  std::string name = "iresnet50";
  InputShape input;
  int64_t embedding_size = 512;
  double dropout = 0.0;
  // Seed of the keyed randomness of ViT's token masking and drop path (see Activations::keys).
  uint64_t seed = 0;
};

// What one block of a backbone hands to the next.
struct Activations {
  torch::Tensor x;
  // Per-sample keys (int64 [B]) of the keyed randomness of stochastic layers (ViT's masking and
  // drop path): a sample's random draws depend on its key only, so W ranks draw what 1 rank draws
  // for the same global batch. Training passes the samples' global indices; undefined keys (or
  // eval mode) draw nothing.
  torch::Tensor keys;
  // ViT with masking: the order that puts kept and masked tokens back (int64 [B, tokens]), from
  // the first block to the last. Undefined otherwise.
  torch::Tensor restore;
  // x's per-channel sums, where the block that wrote x formed them for the next one's batch norm
  // (IResNet's). They hold only while summed.y is x (summed_input).
  SummedMap summed = {};
  // Whether the block should form its output's sums: forward_blocks asks where the next block runs
  // right after it on the same output, not where the output leaves (a checkpointed block, a
  // pipeline stage's last).
  bool sum_output = false;
};

// in.x with its sums where they are x's, else without.
SummedMap summed_input(const Activations& in);

// A network mapping images [B, C, H, W] to embeddings [B, D], replicated on every rank, or cut
// into consecutive stages (pipeline parallelism). It is a sequence of blocks: block 0 takes the
// images, the last one gives the embedding, and each owns the state-dict entries of the modules
// it runs (in_block), so a stage can hold exactly its blocks' parameters.
//
// Parameter and buffer names, shapes and state-dict order are insightface arcface_torch's for the
// networks it has (r18 ... r200, mbf, vit_t ... vit_h), so that its checkpoints load here and
// exported ones load there with load_state_dict(strict=True).
class Backbone : public torch::nn::Module {
 public:
  // Every block in order.
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& keys = {});
  // Blocks [begin, end) on `in`. With activation checkpointing, in training, the blocks between
  // the first and the last keep only their input and run again in backward.
  Activations forward_blocks(Activations in, int64_t begin, int64_t end);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // "layer3.12", for logs.
  const std::string& block_name(int64_t block) const { return blocks_.at(block).name; }
  // Whether state-dict entry `name` belongs to block `block`.
  bool in_block(const std::string& name, int64_t block) const;
  // The block holding state-dict entry `name`.
  int64_t block_of(const std::string& name) const;

  // Parameters and buffers as PyTorch's state_dict() orders them: module by module in
  // registration order (depth first), each module's parameters, then its buffers.
  StateDict state_dict();
  // Copies `source` into this backbone's state, converting dtypes. Strict, as PyTorch's
  // load_state_dict(strict=True): every entry present (under its legacy name, too), nothing extra,
  // the same shapes; otherwise one Error from `what` listing what is missing, extra and of another
  // shape.
  void load_state_dict(const StateDict& source, const std::string& what);
  // The name checkpoints written before myriad took insightface's names gave state-dict entry
  // `name`; empty when it is the same or the network is newer than the rename.
  virtual std::string legacy_name(const std::string& name) const { return ""; }

  // Stores the 4-D weights (convolutions) channels-last, or back in the default layout. With
  // channels-last weights and inputs, cuDNN runs its NHWC kernels, the fast ones for bf16 and fp16
  // on tensor cores; every layer between convolutions keeps the layout. The values do not change.
  void set_channels_last(bool on);
  bool channels_last() const { return channels_last_; }
  // `images` in the layout this backbone computes in (callers pass inputs through it).
  torch::Tensor in_layout(const torch::Tensor& images) const;

  // Recompute the middle blocks in backward instead of keeping their activations (training only).
  // Batch norm inside them updates its running statistics once, in the first pass.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  // In training under autocast, forward_blocks casts the convolutions' weights (those that
  // convolution_weights names) in one pass per run of consecutive blocks that are not recomputed,
  // and their gradients come back in one (WeightCasts), rather than one by one; off, autocast casts
  // them. A group's gradients come back when its first block's backward ends, so runs whose
  // gradient all-reduces overlap backward turn it off.
  void set_grouped_weight_casts(bool on) { grouped_weight_casts_ = on; }
  bool grouped_weight_casts() const { return grouped_weight_casts_; }
  // The groups [first, end) of blocks whose convolution weights a training forward_blocks(begin,
  // end) casts together: the runs of blocks that are not recomputed.
  std::vector<std::pair<int64_t, int64_t>> weight_cast_groups(int64_t begin, int64_t end) const;
  // For the start-up line: "convolution weights cast in N groups", or empty where none would be.
  std::string weight_casts_note() const;

  // Whether a block sums its output for the next block's batch norm (Activations::sum_output; on
  // by default). Off, each batch norm runs its own statistics pass: benchmarks time both routes.
  void set_output_sums(bool on) { output_sums_ = on; }
  bool output_sums() const { return output_sums_; }

  // Multiply-adds of the convolutions, linear layers and attention in one image's forward pass: a
  // training step costs about 3 x 2 x this many floating-point operations per image.
  int64_t multiply_adds() const { return multiply_adds_; }

  // Block `block` on `in` (one block: the unit of pipeline stages and of checkpointing).
  virtual Activations forward_block(int64_t block, Activations in) = 0;
  // The weights of block `block`'s convolutions, each of which every training forward of the block
  // runs through BatchNormImpl::convolve (which takes WeightCasts' copies); none by default.
  virtual std::vector<torch::Tensor> convolution_weights(int64_t block) const { return {}; }

  // The inference graph (as eval mode computes: batch norm's running statistics, no dropout, no
  // masking or drop path) appended to `g` on images `x`; returns the embedding's name.
  virtual std::string to_onnx(OnnxGraph& g, const std::string& x) const = 0;

 protected:
  // Whether training recomputes block `b` (activation checkpointing).
  bool checkpointed_in_training(int64_t b) const;
  // The convolution weights of blocks [group.first, group.second).
  std::vector<torch::Tensor> convolution_weights(std::pair<int64_t, int64_t> group) const;

  // Declares the next block: `name` for logs, and the state-dict names it owns (an entry belongs
  // to the block of the first prefix it equals or extends by a ".").
  void add_block(std::string name, std::vector<std::string> prefixes);
  // Constructors count each convolution and linear layer: its output positions (H x W; 1 for a
  // linear layer) times its weight's size (a dot product over the fan-in per output channel).
  void add_multiply_adds(int64_t n) { multiply_adds_ += n; }

 private:
  struct Block {
    std::string name;
    std::vector<std::string> prefixes;
  };
  std::vector<Block> blocks_;
  bool channels_last_ = false;
  bool checkpointing_ = false;
  bool output_sums_ = true;
  bool grouped_weight_casts_ = true;
  int64_t multiply_adds_ = 0;
};

// The names make_backbone accepts: insightface's (r18, r34, r50, r100, r200, mbf, vit_t, vit_s,
// vit_b, vit_l, vit_h) and myriad's own (iresnet18 ... iresnet200 as the same networks,
// mobilefacenet, smallcnn).
const std::vector<std::string>& backbone_names();
// insightface's name of a backbone ("iresnet50" -> "r50"); the name itself when it has none.
std::string insightface_name(const std::string& name);

// An unknown name, or an input shape the network cannot take, is a UsageError.
std::shared_ptr<Backbone> make_backbone(const BackboneOptions& options);

// True while blocks run again under activation checkpointing: batch norm then leaves its running
// statistics alone, which the first pass already updated.
bool recomputing_activations();

}  // namespace myriad
