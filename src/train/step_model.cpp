#include "myriad/train/step_model.h"

#include <algorithm>
#include <cmath>

#include "myriad/train/train_config.h"

namespace myriad {

namespace {

// Seconds to move `bytes` through a collective of bus factor `factor`; nothing with one rank.
double collective_seconds(double bytes, double factor, double busbw, double latency) {
  if (factor <= 0.0 || bytes <= 0.0) return 0.0;
  return latency + bytes * factor / busbw;
}

}  // namespace

double all_reduce_bus_factor(int64_t ranks) {
  return ranks > 1 ? 2.0 * static_cast<double>(ranks - 1) / static_cast<double>(ranks) : 0.0;
}

double all_gather_bus_factor(int64_t ranks) {
  return ranks > 1 ? static_cast<double>(ranks - 1) / static_cast<double>(ranks) : 0.0;
}

StepShape step_shape(const TrainConfig& config, int64_t ranks, int64_t num_classes,
                     int64_t backbone_params) {
  StepShape s;
  s.ranks = ranks;
  s.batch_per_rank = config.batch_size;
  s.num_classes = num_classes;
  s.embedding_size = config.embedding_size;
  s.sample_rate = config.sample_rate;
  // The GPUs that the model is for compute in bfloat16 at full speed.
  const Precision precision = resolve_precision(config.precision, /*fast_bfloat16=*/true);
  s.gemm_bytes = precision == Precision::kFp32 ? 4 : 2;
  const int64_t states = optimizer_states(config);
  s.classifier_states = states;
  s.classifier_state_bytes = config.classifier_state_dtype == torch::kBFloat16 ? 2 : 4;
  s.classifier_weight_bytes = config.classifier_weight_dtype == torch::kBFloat16 ? 2 : 4;
  s.classifier_rows = row_source(config.classifier_weight_dtype, compute_dtype(precision),
                                 config.sample_rate < 1.0);
  s.classifier_workspace = config.classifier_workspace;
  // The model is of H100 and H200 GPUs, where --fused-classifier auto takes the fused kernels.
  s.classifier_logits = config.fused_classifier != Toggle::kOff &&
                                fused_kernels_take(compute_dtype(precision), config.embedding_size)
                            ? Logits::kInRegisters
                            : Logits::kInMemory;
  // Where the fused kernels run: SGD on bf16 rows, at the global batches the kernel takes.
  const int64_t batch = ranks * config.batch_size;
  s.classifier_update_fused =
      s.classifier_logits == Logits::kInRegisters && config.optimizer == OptimizerKind::kSgd &&
      config.classifier_weight_dtype == torch::kBFloat16 && fused_update_batch_fits(batch) &&
      fused_update_chosen(fused_update_choice(config.fused_update), batch);
  // myriad-train updates the rows with the update kernels (WeightUpdate::kFused).
  s.classifier_row_gradient = row_gradient_store(config.classifier_weight_dtype,
                                                 compute_dtype(precision), /*update_kernels=*/true);
  s.classifier_sgd_rows = config.optimizer == OptimizerKind::kSgd && !s.classifier_update_fused;
  s.backbone_params = backbone_params;
  s.backbone_states = states;
  s.grad_comm_bytes = config.grad_comm_dtype == torch::kFloat32 ? 4 : 2;
  s.bucket_bytes = config.bucket_bytes;
  return s;
}

namespace {

// The classifier shard's chunk plan, FLOPs and bytes, and their times at `rates`.
void predict_classifier(const StepShape& s, const StepRates& rates, StepCost& c) {
  const double b = static_cast<double>(s.ranks * s.batch_per_rank);
  const double d = static_cast<double>(s.embedding_size);
  const double g = static_cast<double>(s.gemm_bytes);
  const int64_t shard = (s.num_classes + s.ranks - 1) / s.ranks;
  c.class_rows = std::min<int64_t>(
      shard, static_cast<int64_t>(std::ceil(static_cast<double>(shard) * s.sample_rate)));
  const double rows = static_cast<double>(c.class_rows);
  const bool fused = s.classifier_logits == Logits::kInRegisters;
  const RowGradientStore row_gradient =
      s.classifier_update_fused ? RowGradientStore::kNone : s.classifier_row_gradient;
  c.plan =
      plan_chunks(c.class_rows, s.ranks * s.batch_per_rank, s.embedding_size, s.gemm_bytes,
                  s.classifier_rows, s.classifier_workspace, s.classifier_logits, row_gradient);
  const double passes = c.plan.cache ? 1.0 : 2.0;  // over the rows, and over the logits

  // The fused kernels compute the logits in forward and again in backward, unless their cached
  // plan keeps the exponentials (every margin's).
  c.classifier_flops = (c.plan.cache ? 3.0 : 4.0) * 2.0 * b * d * rows;
  // Per logit: float32 logits written and read by each pass, their gradient read once in float32
  // and written in the GEMM dtype; the fused kernels write only that gradient (or the kept
  // exponentials), which both GEMMs read.
  const double per_logit = fused ? 3.0 * g : 4.0 * (passes + 2.0) + g;
  // Per weight element: read and GEMM copy per pass (or, reading the stored rows, one more read
  // for 1/|w|; or only the copy, written by SGD's update), the rows' gradient written and read
  // unless the update is fused, the weight and its state read and written by the update.
  const double w = static_cast<double>(s.classifier_weight_bytes);
  const bool copy_from_update =
      s.classifier_sgd_rows &&
      update_writes_copy(s.classifier_rows, s.sample_rate < 1.0, c.plan.cache);
  const double rows_read = s.classifier_rows == RowSource::kStored ? w * (passes + 1.0)
                           : copy_from_update                      ? g
                                                                   : (w + g) * passes;
  const double per_weight =
      rows_read +
      (row_gradient == RowGradientStore::kNone
           ? 0.0
           : 2.0 * static_cast<double>(c10::elementSize(row_gradient_dtype(row_gradient)))) +
      2.0 * w + 2.0 * static_cast<double>(s.classifier_states * s.classifier_state_bytes);
  c.classifier_traffic = rows * b * per_logit + rows * d * per_weight;
  c.classifier_gemm = c.classifier_flops / rates.gemm_flops;
  c.classifier_memory = c.classifier_traffic / rates.memory_bandwidth;
}

// The backbone's gradient all-reduce (in buckets, the last one exposed unless measured) and the
// classifier's feature and statistics collectives.
void predict_communication(const StepShape& s, const StepRates& rates, StepCost& c) {
  const double b = static_cast<double>(s.ranks * s.batch_per_rank);
  const double d = static_cast<double>(s.embedding_size);
  const double params = static_cast<double>(s.backbone_params);
  c.grad_all_reduce_bytes = params * static_cast<double>(s.grad_comm_bytes);
  const double reduce = all_reduce_bus_factor(s.ranks);
  const double gather = all_gather_bus_factor(s.ranks);
  // One all-reduce per bucket.
  const double buckets = std::ceil(c.grad_all_reduce_bytes / static_cast<double>(s.bucket_bytes));
  c.grad_all_reduce =
      collective_seconds(c.grad_all_reduce_bytes, reduce, rates.all_reduce_busbw, 0.0) +
      (reduce > 0.0 ? buckets * rates.collective_latency : 0.0);
  const double last_bucket =
      collective_seconds(std::min(c.grad_all_reduce_bytes, static_cast<double>(s.bucket_bytes)),
                         reduce, rates.all_reduce_busbw, rates.collective_latency);
  c.exposed_all_reduce = s.measured_exposed_all_reduce >= 0.0
                             ? s.measured_exposed_all_reduce
                             : std::max(last_bucket, c.grad_all_reduce - 2.0 / 3.0 * c.backbone);
  // Forward gathers float32 features and int64 labels; backward reduce-scatters the features'
  // float32 gradient.
  c.feature_bytes = b * (4.0 * d + 8.0);
  c.feature_comm =
      collective_seconds(c.feature_bytes, gather, rates.all_gather_busbw,
                         rates.collective_latency) +
      collective_seconds(b * 4.0 * d, gather, rates.all_gather_busbw, rates.collective_latency);
  // The per-sample max, then the rescaled sum of exponentials with the target logit.
  c.stats_bytes = b * 4.0 * 3.0;
  c.stats_comm =
      collective_seconds(b * 4.0, reduce, rates.all_reduce_busbw, rates.collective_latency) +
      collective_seconds(b * 8.0, reduce, rates.all_reduce_busbw, rates.collective_latency);
}

// What each rank holds: the classifier's shard and state, its workspace, the backbone's state and
// the activations.
void predict_memory(const StepShape& s, StepCost& c) {
  const int64_t batch = s.ranks * s.batch_per_rank;
  const double b = static_cast<double>(batch);
  const double d = static_cast<double>(s.embedding_size);
  const double g = static_cast<double>(s.gemm_bytes);
  const double shard = static_cast<double>((s.num_classes + s.ranks - 1) / s.ranks);
  c.classifier_weight_memory = shard * d * static_cast<double>(s.classifier_weight_bytes);
  c.classifier_state_memory =
      shard * d * static_cast<double>(s.classifier_states * s.classifier_state_bytes);
  // What a chunk's rows hold at the peak, as measured (docs/benchmarks.md: 24.9 and 42.0 GiB on
  // 2 H200s at C = 8M): logits and GEMM rows, and the logits' gradient;
  // plan_chunks budgets the rows' gradient too where the update is not fused. Then the
  // gathered features (float32 and GEMM copies), their gradient and the labels.
  const double per_row =
      static_cast<double>(chunk_cached_bytes_per_row(batch, s.embedding_size, s.gemm_bytes,
                                                     s.classifier_rows, s.classifier_logits) +
                          s.gemm_bytes * batch);
  c.workspace_memory =
      static_cast<double>(c.plan.chunk_rows) * per_row + b * d * (8.0 + g) + b * 8.0;
  // Weights and gradients (their buckets) in float32, the optimizer state, and a compressed copy
  // of the buckets when the all-reduce is narrower than float32.
  c.backbone_state_memory =
      static_cast<double>(s.backbone_params) * 4.0 * static_cast<double>(2 + s.backbone_states) +
      (s.grad_comm_bytes < 4 ? c.grad_all_reduce_bytes : 0.0);
  c.activation_memory = s.activation_bytes;
  c.total_memory = c.classifier_weight_memory + c.classifier_state_memory + c.workspace_memory +
                   c.backbone_state_memory + c.activation_memory;
}

}  // namespace

StepCost predict_step(const StepShape& s, const StepRates& rates) {
  StepCost c;
  c.backbone = s.backbone_seconds;
  predict_classifier(s, rates, c);
  predict_communication(s, rates, c);
  c.step = c.backbone + c.classifier() + c.communication();
  predict_memory(s, c);
  return c;
}

}  // namespace myriad
