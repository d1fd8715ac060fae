#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "myriad/classifier/chunk_plan.h"
#include "myriad/classifier/class_partition.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/classifier/shard_optimizer.h"

namespace myriad {

class Communicator;
class PhaseTimer;

// What backward does with the classifier's gradient.
enum class WeightUpdate {
  // Apply the shard optimizer chunk by chunk inside backward; no gradient of the shard is stored.
  kFused,
  // Accumulate dL/dW into weight_grad() (for checks and tests); the weights do not change.
  kAccumulateGrad,
};

// What forward does with NaN or infinite features.
enum class NonFinitePolicy {
  kError,  // a collective Error naming the sample
  kSkip,   // the loss is NaN and backward leaves weights and features' gradient at zero (fp16
           // loss scaling overflowed: the trainer skips the step)
};

struct ShardedSoftmaxOptions {
  int64_t num_classes = 0;
  int64_t embedding_size = 0;
  MarginConfig margin;
  // Operand dtype of the GEMMs (float32, bfloat16 or float16). Logits and softmax statistics
  // are always float32.
  torch::ScalarType gemm_dtype = torch::kFloat32;
  // Storage of the weight shard: float32, or bfloat16 updated with stochastic rounding (half the
  // memory; see ShardOptimizer).
  torch::ScalarType weight_dtype = torch::kFloat32;
  // Memory for the chunked logits, GEMM copies and gradients (see plan_chunks).
  int64_t workspace_bytes = int64_t{8} << 30;
  // Partial FC: fraction of negative classes sampled per step; 1 uses every class.
  double sample_rate = 1.0;
  uint64_t seed = 0;
  WeightUpdate update = WeightUpdate::kFused;
  NonFinitePolicy non_finite = NonFinitePolicy::kError;
  OptimizerOptions optimizer;
  // Initial weights are normal(0, init_std), drawn per global element so that they do not
  // depend on the number of ranks.
  double init_std = 0.01;
};

// The classifier of design §1: this rank's shard W_r [n_r, D] of a margin-softmax classifier
// over C classes, trained with the features of the whole global batch.
//
// forward(local features [b_r, D], local labels [b_r]) returns the mean loss over the global
// batch, the same scalar on every rank. It all-gathers features and labels, streams the shard's
// classes in chunks (the [B, C] logits never exist anywhere), and combines the per-row max, sum
// of exponentials and target logit across ranks. Local batch sizes may differ between ranks.
//
// Backward is wired into autograd: loss.backward() produces the local features' gradient (its
// only communication is a reduce-scatter of dL/dX) and, with WeightUpdate::kFused, updates the
// shard. Every rank's features' gradient is its part of the gradient of the global mean loss.
// The backbone reducer must therefore SUM gradients across ranks, never average them: averaging
// makes every backbone gradient W times too small.
//
// Every forward must be followed by its backward before the next forward that is backpropagated.
class ShardedMarginSoftmax {
 public:
  ShardedMarginSoftmax(Communicator& comm, const ShardedSoftmaxOptions& options,
                       const torch::Device& device);
  ~ShardedMarginSoftmax();
  ShardedMarginSoftmax(const ShardedMarginSoftmax&) = delete;
  ShardedMarginSoftmax& operator=(const ShardedMarginSoftmax&) = delete;

  torch::Tensor forward(const torch::Tensor& features, const torch::Tensor& labels);

  // Global class predicted for each local row: argmax over all C classes of cos (or the raw
  // logit for softmax), combined across ranks. Collective.
  torch::Tensor predict(const torch::Tensor& features);

  const ClassPartition& partition() const { return partition_; }
  const ShardedSoftmaxOptions& options() const { return options_; }
  const torch::Device& device() const { return device_; }
  // This rank's rows, [n_r, D] in options().weight_dtype.
  torch::Tensor& weight() { return weight_; }
  // dL/dW [n_r, D] float32 (WeightUpdate::kAccumulateGrad only).
  torch::Tensor& weight_grad() { return weight_grad_; }
  void zero_grad();
  ShardOptimizer& optimizer() { return *optimizer_; }
  // Forward passes so far; seeds Partial FC's sampling. Checkpoints restore it.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // The loss scale folded into the incoming gradient (fp16 training), so that fused updates use
  // the true gradient: a float32 [1] on the device, read there; undefined for none.
  void set_loss_scale(const torch::Tensor& scale);
  // The plan of the latest forward.
  const ChunkPlan& last_plan() const { return last_plan_; }
  // Times forward and backward phases ("classifier.*") into `timer` (null: no timing).
  void set_phase_timer(PhaseTimer* timer) { timer_ = timer; }

  struct Step;
  // Autograd entry points (ShardedSoftmaxFunction); not for direct use.
  torch::Tensor run_forward(const torch::Tensor& features, const torch::Tensor& labels,
                            int64_t* step_id);
  torch::Tensor run_backward(int64_t step_id, const torch::Tensor& grad);

 private:
  Communicator& comm_;
  ShardedSoftmaxOptions options_;
  torch::Device device_;
  ClassPartition partition_;
  torch::Tensor weight_;
  torch::Tensor weight_grad_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  std::unique_ptr<Step> pending_;
  int64_t steps_ = 0;
  torch::Tensor inv_loss_scale_;  // undefined: 1
  ChunkPlan last_plan_;
  PhaseTimer* timer_ = nullptr;

  void phase(const char* name);
  // Rows [begin, end) of the step's active rows as the GEMMs read them. When the shard is stored
  // in the GEMM dtype and every row takes part, that is the stored rows themselves, and a margin's
  // normalisation is applied to the logits instead (1/|w| per class, Step::row_scales), which
  // saves writing and reading a normalised copy; otherwise a normalised copy in the GEMM dtype.
  torch::Tensor chunk_rows(const Step& step, int64_t begin, int64_t end);
};

// Rows [first, first + rows) of the classifier's initial weights, in options.weight_dtype:
// normal(0, init_std), element (i, j) drawn from (seed, i * D + j), so that they do not depend on
// the number of ranks.
torch::Tensor initial_shard(int64_t first, int64_t rows, const ShardedSoftmaxOptions& options,
                            const torch::Device& device);

}  // namespace myriad
