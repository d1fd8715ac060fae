#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "myriad/classifier/chunk_plan.h"
#include "myriad/classifier/class_partition.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/classifier/shard_optimizer.h"

namespace myriad {

class Communicator;
class HostCopy;
class LogitsPath;
class PhaseMarks;
class PhaseTimer;
class RowUpdater;
struct GradientScale;
struct RowStatistics;
struct SoftmaxStep;

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

// Whether the fused Hopper kernels compute the logits (see ShardedMarginSoftmax::kernels()). They
// apply on H100 and H200 GPUs with bfloat16 GEMMs and D a multiple of 8 up to 512.
enum class FusedKernels {
  kAuto,      // where they apply
  kRequired,  // where they do not, the constructor fails on every rank before allocating
  kOff,       // GEMMs and softmax kernels everywhere
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
  FusedKernels fused_kernels = FusedKernels::kAuto;
  // Where the fused kernels run SGD on bfloat16 rows and a global batch that is a multiple of 8,
  // form the rows' gradient and apply the update in one kernel (fused_sgd_rows), the float32
  // gradient never in memory: at the batches fused_update_chosen picks (chunk_plan.h). kOn where
  // the update cannot be fused fails the constructor on every rank before it allocates.
  FusedUpdate fused_update = FusedUpdate::kAuto;
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

  // A step whose global batch reaches the classifier in parts, one micro-batch at a time (the
  // 1F1B pipeline schedule, docs/pipeline.md). begin_parts takes this rank's labels of the whole
  // step (empty where it holds none) and its rows of each part, in order (summing to the labels'
  // rows): they are checked once, fix the classes Partial FC samples for every part, the batch B
  // that every part's loss is a share of, and every rank's rows of every part. Each forward() is
  // then one part: it returns its samples' share of the step's mean loss (the parts' losses sum
  // to the loss of the whole), and its backward gives the part's features' gradient and changes
  // no weight. Every part's backward takes the same incoming gradient (1, or the loss scale). A
  // part's collectives skip the cross-rank agreement (AgreedBeforehand), which would hold each
  // rank's host until every rank arrives: what it would catch was agreed here, and a part's
  // features (float32 [rows, D]) and labels (int64 [rows]) are checked on each rank before its
  // first collective. finish_parts() updates the shard once over all parts, recomputing the
  // logits chunk by chunk from the features and softmax statistics each part kept: one more GEMM
  // pass over the batch than forward() of the whole, and the same update. Features are checked
  // for NaN there, for all parts at once. Both are collective.
  void begin_parts(const torch::Tensor& labels, const std::vector<int64_t>& part_rows);
  void finish_parts();

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
  // 1 / the loss scale folded into the incoming gradient (fp16 training), so that fused updates
  // use the true gradient: a float32 [1] on the device that the caller keeps current
  // (DynamicLossScaler::inverse_scale), read there at every backward; undefined for none.
  void set_inverse_loss_scale(const torch::Tensor& inverse) { inv_loss_scale_ = inverse; }
  // The plan of the latest forward.
  const ChunkPlan& last_plan() const { return last_plan_; }
  // Whether the next forward takes the stored rows' 1/|w| from the last update, which wrote them
  // as it stored the rows (SGD on the GPU), rather than reading every row to measure them.
  bool norms_from_update() const;
  // Whether the next forward takes the GEMMs' copy of the rows from the last update, which wrote
  // it as it stored the rows (SGD on the GPU, update_writes_copy), rather than making its own.
  bool copy_from_update() const;
  // Whether the fused Hopper kernels compute the logits (never in memory; H100 and H200 with
  // bfloat16 GEMMs and D a multiple of 8 up to 512), rather than GEMMs with the softmax kernels
  // (or LibTorch operations on the CPU).
  bool fused() const;
  Logits logits() const;
  // The two strategies of backward, chosen in the constructor, for the start-up line: which path
  // computes the logits and their gradient, then "; rows: " and what updates the rows.
  std::string kernels() const;
  // What the latest forward kept for backward ("cached logits", "exponentials kept for backward
  // (bf16)", ...), or "recompute in backward".
  std::string kept_for_backward() const;
  // Times forward and backward phases ("classifier.*") into `timer` (null: no timing).
  void set_phase_timer(PhaseTimer* timer);

  struct Parts;
  // Autograd entry points (ShardedSoftmaxFunction); not for direct use. Without `backward` (no
  // gradient will be asked), forward caches nothing for it.
  torch::Tensor run_forward(const torch::Tensor& features, const torch::Tensor& labels,
                            int64_t* step_id, bool backward = true);
  torch::Tensor run_backward(int64_t step_id, const torch::Tensor& grad);

 private:
  Communicator& comm_;
  ShardedSoftmaxOptions options_;
  torch::Device device_;
  ClassPartition partition_;
  torch::Tensor weight_;
  torch::Tensor weight_grad_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  // Held by the strategies below, which are built after it and hold it by reference.
  std::unique_ptr<PhaseMarks> phases_;
  std::unique_ptr<LogitsPath> logits_;
  std::unique_ptr<RowUpdater> updater_;
  std::unique_ptr<SoftmaxStep> pending_;
  std::unique_ptr<Parts> parts_;  // between begin_parts and finish_parts
  int64_t steps_ = 0;
  int64_t forwards_ = 0;          // pairs each backward with its forward
  torch::Tensor inv_loss_scale_;  // undefined: 1
  ChunkPlan last_plan_;

  // What a step's plan is for: a whole step, a part of one (forward and the features' gradient),
  // the update of a step in parts (finish_parts), or a prediction.
  enum class StepUse { kWhole, kPart, kFinishParts, kPredict };
  // The one planning of a step's chunks, from its batch and active rows: where the GEMMs read the
  // rows, the chunk plan, and each chunk's 1/|w| where the GEMMs read the stored rows.
  void plan_step(SoftmaxStep& step, StepUse use) const;
  GradientScale gradient_scale(const torch::Tensor& grad, int64_t divisor) const;
  // The chunks' backward: each chunk's logits' gradient (logits_), then as asked the features'
  // gradient (added into `dxn`, when given) and the rows' update (`updater`, when given).
  void backward_chunks(SoftmaxStep& step, const GradientScale& g, torch::Tensor* dxn,
                       RowUpdater* updater);
  // Chunk c's GEMM operand rows for backward: kept from forward, or prepared again.
  torch::Tensor chunk_operand(SoftmaxStep& step, int64_t c);
  // Whether every part's features are finite: a collective error naming the sample where not,
  // or false under NonFinitePolicy::kSkip.
  bool parts_finite(const Parts& parts) const;

  // Forward's parts, in order. The step's features and labels gathered from every rank (labels
  // as int64) and checked for shape, and the step's batch, divisor and offset of this rank's rows.
  struct Gathered {
    torch::Tensor x, y;
  };
  Gathered gather_inputs(SoftmaxStep& step, const torch::Tensor& features,
                         const torch::Tensor& labels);
  // The features of every rank of step.counts, checked for shape: sets the batch and the offset
  // of this rank's rows.
  torch::Tensor gather_features(SoftmaxStep& step, const torch::Tensor& features) const;
  // Every rank's rows of each part (`part_rows` here; `labels` is every rank's labels of the
  // step), agreed on by all: a collective error for another number of parts on some rank, or
  // rows that do not sum to its labels.
  std::vector<std::vector<int64_t>> agree_part_rows(const std::vector<int64_t>& part_rows,
                                                    const std::vector<int64_t>& labels) const;
  // The next part's every rank's rows, once its features and labels on this rank are as agreed.
  std::vector<int64_t> part_counts(const torch::Tensor& features, const torch::Tensor& labels);
  // The features in float32 (normalised for a normalised margin) and in the GEMM dtype.
  void normalize_features(SoftmaxStep& step, const torch::Tensor& x) const;
  // The rows that take part (Partial FC's sample, or all), each sample's target column among them,
  // and the chunk plan.
  void choose_rows(SoftmaxStep& step, const torch::Tensor& y);
  // Per sample over this shard's rows: the max logit, the sum of exp(logit - max) and the target
  // logit (0 where another shard holds it), chunk by chunk.
  RowStatistics forward_chunks(SoftmaxStep& step);
  // 1/|w| of stored rows [begin, end): as the last update wrote them where they are current,
  // else measured (chunk_inv_norms).
  torch::Tensor stored_row_scales(int64_t begin, int64_t end) const;
  // The statistics over all shards (consuming `local`), kept in the step; returns the loss.
  torch::Tensor reduce_statistics(SoftmaxStep& step, RowStatistics& local);
  // The step's (min label, max label, all features finite), queued at once after the gather and
  // copied to the host behind it, so that the host checks it while the device works through
  // forward.
  static HostCopy summarize_inputs(const Gathered& in);
  // Labels outside [0, C) and non-finite features: a collective error, or (fp16's policy) a
  // skipped step, from summarize_inputs' summary.
  void check_inputs(SoftmaxStep& step, const Gathered& in, HostCopy& summary) const;
  // Each sample's row in this shard (global labels `y`), or -1 where another shard holds it.
  torch::Tensor local_targets(const torch::Tensor& y) const;
  // Partial FC's rows of step `step` for these targets; undefined when every row takes part.
  torch::Tensor sampled_rows(const torch::Tensor& local_target, int64_t step) const;
  // Collective errors for labels outside [0, C): `summary` holds y's min and max on the host.
  void check_labels(const torch::Tensor& y, const torch::Tensor& summary,
                    const std::vector<int64_t>& counts) const;
  void phase(const char* name);
  // Rows [begin, end) of the step's active rows as the GEMMs read them. When the shard is stored
  // in the GEMM dtype and every row takes part, that is the stored rows themselves, and a margin's
  // normalisation is applied to the logits instead (1/|w| per class, SoftmaxStep::row_scales),
  // which saves writing and reading a normalised copy; otherwise a normalised copy in the GEMM
  // dtype.
  torch::Tensor chunk_rows(const SoftmaxStep& step, int64_t begin, int64_t end);
};

// Rows [first, first + rows) of the classifier's initial weights, in options.weight_dtype:
// normal(0, init_std), element (i, j) drawn from (seed, i * D + j), so that they do not depend on
// the number of ranks.
torch::Tensor initial_shard(int64_t first, int64_t rows, const ShardedSoftmaxOptions& options,
                            const torch::Device& device);

}  // namespace myriad
