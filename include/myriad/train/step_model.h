#pragma once

#include <cstdint>

#include "myriad/classifier/chunk_plan.h"

namespace myriad {

struct TrainConfig;

// A first-order model of one data-parallel training step (one pipeline stage) on one rank: the
// work and bytes the configuration implies, and the time and memory they cost at given rates.
// myriad-doctor feeds it measured rates; `myriad-doctor --model-table` assumed ones
// (docs/multi-node.md).

// nccl-tests' bus-bandwidth factors over `ranks` ranks: busbw = algbw x factor, so that a
// collective's time is bytes x factor / busbw whatever the number of ranks.
double all_reduce_bus_factor(int64_t ranks);
// All-gather and reduce-scatter (bytes: the whole gathered buffer).
double all_gather_bus_factor(int64_t ranks);

// What a step is made of (per rank unless said otherwise).
struct StepShape {
  int64_t ranks = 1;
  int64_t batch_per_rank = 128;
  int64_t num_classes = 0;  // C, over all ranks
  int64_t embedding_size = 512;
  double sample_rate = 1.0;       // Partial FC
  int64_t gemm_bytes = 2;         // classifier GEMM operand element size (4 with fp32)
  int64_t classifier_states = 1;  // optimizer state tensors per weight: SGD 1, AdamW 2
  int64_t classifier_state_bytes = 4;
  int64_t classifier_weight_bytes = 4;
  // Whether the GEMMs read the stored shard or a copy of it (row_source()).
  RowSource classifier_rows = RowSource::kCopy;
  // Whether the logits exist in memory, or only in the fused kernels' registers.
  Logits classifier_logits = Logits::kInMemory;
  // Whether SGD forms the rows' gradient in the update kernel (FusedUpdate), never in memory.
  bool classifier_update_fused = false;
  // Where the rows' gradient lives otherwise (row_gradient_store()).
  RowGradientStore classifier_row_gradient = RowGradientStore::kFloat32;
  // Whether SGD's row kernels update the rows (not fused), and so write what the next forward
  // would make of them (update_writes_copy).
  bool classifier_sgd_rows = false;
  int64_t classifier_workspace = int64_t{2} << 30;
  int64_t backbone_params = 0;
  int64_t backbone_states = 1;  // SGD 1, AdamW 2
  int64_t grad_comm_bytes = 4;  // element size of the gradient all-reduce (--grad-comm-dtype)
  int64_t bucket_bytes = int64_t{25} << 20;
  double backbone_seconds = 0.0;  // forward + backward of batch_per_rank images
  double activation_bytes = 0.0;  // what the backbone keeps from forward to backward
  // The part of the gradient all-reduce that backward did not hide, where it was measured (the
  // doctor runs the training step on the real links); negative: modelled (predict_step).
  double measured_exposed_all_reduce = -1.0;
};

// The step `config` describes on `ranks` ranks, with C = `num_classes` and a backbone of
// `backbone_params` parameters; the backbone's time and activations are left to the caller.
StepShape step_shape(const TrainConfig& config, int64_t ranks, int64_t num_classes,
                     int64_t backbone_params);

// Rates of this machine (bytes and FLOPs per second).
struct StepRates {
  double gemm_flops = 0.0;          // the classifier's GEMMs
  double memory_bandwidth = 0.0;    // device memory: read + write bytes per second
  double all_reduce_busbw = 0.0;    // among all ranks, at gradient-bucket sizes
  double all_gather_busbw = 0.0;    // among all ranks
  double collective_latency = 0.0;  // seconds of one small collective among all ranks
};

struct StepCost {
  // Work.
  int64_t class_rows = 0;  // rows of the largest shard taking part in a step
  ChunkPlan plan;
  double classifier_flops = 0.0;
  double classifier_traffic = 0.0;     // bytes read and written in device memory
  double grad_all_reduce_bytes = 0.0;  // the backbone's gradients
  double feature_bytes = 0.0;          // all-gathered features and labels, per direction
  double stats_bytes = 0.0;            // softmax statistics all-reduced
  // Seconds.
  double backbone = 0.0;
  double classifier_gemm = 0.0;
  double classifier_memory = 0.0;
  double grad_all_reduce = 0.0;     // the whole all-reduce
  double exposed_all_reduce = 0.0;  // what backward does not hide of it
  double feature_comm = 0.0;        // features' all-gather and their gradient's reduce-scatter
  double stats_comm = 0.0;
  double step = 0.0;
  // Bytes of device memory.
  double classifier_weight_memory = 0.0;
  double classifier_state_memory = 0.0;
  double workspace_memory = 0.0;
  double backbone_state_memory = 0.0;  // weights, gradients (buckets), optimizer state
  double activation_memory = 0.0;
  double total_memory = 0.0;

  double classifier() const { return classifier_gemm + classifier_memory; }
  double communication() const { return exposed_all_reduce + feature_comm + stats_comm; }
};

// The classifier follows docs/classifier.md: per active row and sample, float32 logits written,
// read by the statistics and by the logit gradient, whose result (GEMM dtype) is written; per row
// and embedding element, the row read and its GEMM copy written, and the fused update reading and
// writing the row and its state and reading its float32 gradient (which the fused update never
// writes). Three GEMMs when the logits are
// cached, four (and a second pass over the rows) when backward recomputes them. The backbone's
// all-reduce overlaps backward (two thirds of the backbone's time) except for its last bucket,
// unless the shape holds a measured exposure.
StepCost predict_step(const StepShape& shape, const StepRates& rates);

}  // namespace myriad
