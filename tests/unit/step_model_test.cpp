#include <gtest/gtest.h>

#include "myriad/train/step_model.h"
#include "myriad/train/train_config.h"

namespace myriad {
namespace {

// 2 ranks of 4 samples (B = 8), C = 10 (5 rows a shard), D = 3, bf16 GEMMs, SGD with float32
// momentum, 100 backbone parameters: small enough to count every byte by hand.
StepShape small_step() {
  StepShape s;
  s.ranks = 2;
  s.batch_per_rank = 4;
  s.num_classes = 10;
  s.embedding_size = 3;
  s.gemm_bytes = 2;
  s.classifier_states = 1;
  s.classifier_state_bytes = 4;
  s.classifier_workspace = int64_t{1} << 30;
  s.backbone_params = 100;
  s.backbone_states = 1;
  s.grad_comm_bytes = 4;
  s.bucket_bytes = 100;
  s.backbone_seconds = 0.3;
  s.activation_bytes = 500;
  return s;
}

StepRates small_rates() {
  StepRates r;
  r.gemm_flops = 7200;
  r.memory_bandwidth = 10100;
  r.all_reduce_busbw = 1000;
  r.all_gather_busbw = 800;
  r.collective_latency = 0.01;
  return r;
}

TEST(StepModel, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(all_reduce_bus_factor(4), 1.5);
  EXPECT_DOUBLE_EQ(all_gather_bus_factor(4), 0.75);
  EXPECT_DOUBLE_EQ(all_reduce_bus_factor(1), 0.0);
  EXPECT_DOUBLE_EQ(all_gather_bus_factor(1), 0.0);
}

TEST(StepModel, CachedStepCountedByHand) {
  const StepCost c = predict_step(small_step(), small_rates());
  EXPECT_EQ(c.class_rows, 5);
  EXPECT_TRUE(c.plan.cache);
  // Three GEMMs of 2 B D rows = 2 * 8 * 3 * 5 = 240 FLOPs.
  EXPECT_DOUBLE_EQ(c.classifier_flops, 720);
  // Per logit 4 (written) + 4 (statistics) + 4 (gradient) + 2 (its bf16 result): 5 * 8 * 14;
  // per weight 4 + 2 (GEMM copy) + 8 (row) + 8 (momentum) + 8 (float32 gradient): 5 * 3 * 30.
  EXPECT_DOUBLE_EQ(c.classifier_traffic, 560 + 450);
  EXPECT_DOUBLE_EQ(c.classifier_gemm, 0.1);
  EXPECT_DOUBLE_EQ(c.classifier_memory, 0.1);
  // 400 bytes of gradients in 4 buckets at factor 1 over 1000 B/s, 0.01 s each; backward (0.2 s)
  // hides part of it, and at least the last bucket (0.01 + 100 / 1000) shows.
  EXPECT_DOUBLE_EQ(c.grad_all_reduce_bytes, 400);
  EXPECT_NEAR(c.grad_all_reduce, 0.44, 1e-12);
  EXPECT_NEAR(c.exposed_all_reduce, 0.24, 1e-12);
  // Features 8 * (4 * 3 + 8) = 160 bytes and their gradient 96 bytes, at factor 1/2 over 800 B/s.
  EXPECT_DOUBLE_EQ(c.feature_bytes, 160);
  EXPECT_NEAR(c.feature_comm, 0.01 + 0.1 + 0.01 + 0.06, 1e-12);
  // max [8] and (sum, target) [8, 2] in float32, at factor 1 over 1000 B/s.
  EXPECT_DOUBLE_EQ(c.stats_bytes, 96);
  EXPECT_NEAR(c.stats_comm, 0.01 + 0.032 + 0.01 + 0.064, 1e-12);
  EXPECT_NEAR(c.step, 0.3 + 0.2 + 0.24 + 0.18 + 0.116, 1e-12);
  // Memory: weight 5 * 3 * 4, momentum the same, chunk buffers 5 * (4 * 8 + 2 * 3 + 2 * 8)
  // (logits, GEMM row, logits' gradient) + features 8 * 3 * (4 + 4 + 2) + labels 64, backbone
  // 100 * 4 * 3, activations 500.
  EXPECT_DOUBLE_EQ(c.classifier_weight_memory, 60);
  EXPECT_DOUBLE_EQ(c.classifier_state_memory, 60);
  EXPECT_DOUBLE_EQ(c.workspace_memory, 270 + 240 + 64);
  EXPECT_DOUBLE_EQ(c.backbone_state_memory, 1200);
  EXPECT_DOUBLE_EQ(c.total_memory, 60 + 60 + 574 + 1200 + 500);
}

// SGD's row kernels write the GEMMs' copy as they store the rows, so a cached step reads no row
// to make it: per weight 2 (the copy written) instead of 4 + 2. A chunked step, or Partial FC's
// sampled rows, still makes its copies in forward.
TEST(StepModel, SgdRowKernelsWriteTheCopy) {
  StepShape s = small_step();
  s.classifier_sgd_rows = true;
  EXPECT_DOUBLE_EQ(predict_step(s, small_rates()).classifier_traffic, 560 + 5 * 3 * 26);
  StepShape chunked = s;
  chunked.classifier_workspace = 2 * 66;
  EXPECT_DOUBLE_EQ(predict_step(chunked, small_rates()).classifier_traffic,
                   5 * 8 * 18 + 5 * 3 * 36);
  StepShape sampled = s;
  sampled.sample_rate = 0.5;  // 3 rows of 5
  EXPECT_DOUBLE_EQ(predict_step(sampled, small_rates()).classifier_traffic,
                   3 * 8 * 14 + 3 * 3 * 30);
}

TEST(StepModel, MeasuredExposureReplacesTheModel) {
  StepShape shape = small_step();
  shape.measured_exposed_all_reduce = 0.05;
  const StepCost c = predict_step(shape, small_rates());
  // The whole all-reduce is still modelled (0.44 s, as above); only its exposed part is taken.
  EXPECT_NEAR(c.grad_all_reduce, 0.44, 1e-12);
  EXPECT_DOUBLE_EQ(c.exposed_all_reduce, 0.05);
  EXPECT_NEAR(c.step, 0.3 + 0.2 + 0.05 + 0.18 + 0.116, 1e-12);
  shape.measured_exposed_all_reduce = 0.0;
  EXPECT_DOUBLE_EQ(predict_step(shape, small_rates()).exposed_all_reduce, 0.0);
}

TEST(StepModel, ChunkedStepRecomputesTheLogits) {
  StepShape s = small_step();
  s.classifier_workspace = 2 * 66;  // plan_chunks' budget of two rows: 3 chunks
  const StepCost c = predict_step(s, small_rates());
  EXPECT_FALSE(c.plan.cache);
  EXPECT_EQ(c.plan.chunk_rows, 2);
  EXPECT_DOUBLE_EQ(c.classifier_flops, 4 * 240);
  // The logits written twice, the rows prepared twice.
  EXPECT_DOUBLE_EQ(c.classifier_traffic, 5 * 8 * 18 + 5 * 3 * 36);
  EXPECT_DOUBLE_EQ(c.workspace_memory, 2 * 54 + 240 + 64);
}

TEST(StepModel, StoredRowsAreReadNotCopied) {
  StepShape s = small_step();
  s.classifier_weight_bytes = 2;
  s.classifier_rows = RowSource::kStored;
  s.classifier_row_gradient = RowGradientStore::kBFloat16;
  const StepCost c = predict_step(s, small_rates());
  EXPECT_TRUE(c.plan.cache);
  // Per weight 2 (the GEMMs' read) + 2 (1/|w|) + 4 (row) + 8 (momentum) + 4 (the gradient in
  // bf16, as the rows: written and read).
  EXPECT_DOUBLE_EQ(c.classifier_traffic, 560 + 5 * 3 * 20);
  // A cached row keeps its logits and 1/|w| (4 * 8 + 4), no copy; then its bf16 logit gradient.
  EXPECT_DOUBLE_EQ(c.workspace_memory, 5 * (36 + 16) + 240 + 64);
}

TEST(StepModel, FusedKernelsKeepNoLogits) {
  StepShape s = small_step();
  s.classifier_logits = Logits::kInRegisters;
  const StepCost c = predict_step(s, small_rates());
  EXPECT_TRUE(c.plan.cache);
  // Cached, forward keeps the exponentials: three products of 240 FLOPs.
  EXPECT_DOUBLE_EQ(c.classifier_flops, 3 * 240);
  // Per logit only the bf16 gradient (or kept exponentials), written once and read by both GEMMs
  // (3 * 2); per weight as in the cached step.
  EXPECT_DOUBLE_EQ(c.classifier_traffic, 5 * 8 * 6 + 450);
  // A cached row keeps its GEMM row (2 * 3), then its bf16 logit gradient (2 * 8).
  EXPECT_DOUBLE_EQ(c.workspace_memory, 5 * (6 + 16) + 240 + 64);
  // In a chunked plan the logits' room goes to more rows: whole tiles of kFusedTileRows.
  s.num_classes = 2 * 1000;
  s.classifier_workspace = 300 * 66;  // 300 rows with logits in memory
  const StepCost chunked = predict_step(s, small_rates());
  EXPECT_EQ(chunked.plan.chunk_rows, 512);  // 300 * 66 / 34 = 582
  // Chunked, backward computes the logits again.
  EXPECT_DOUBLE_EQ(chunked.classifier_flops, 4 * 240 * static_cast<double>(chunked.class_rows) / 5);
  s.classifier_logits = Logits::kInMemory;
  EXPECT_EQ(predict_step(s, small_rates()).plan.chunk_rows, 300);
}

TEST(StepModel, PartialFcAdamWAndNarrowGradients) {
  StepShape s = small_step();
  s.sample_rate = 0.5;
  s.classifier_states = 2;
  s.classifier_state_bytes = 2;
  s.grad_comm_bytes = 2;
  const StepCost c = predict_step(s, small_rates());
  EXPECT_EQ(c.class_rows, 3);  // ceil(5 * 0.5)
  EXPECT_DOUBLE_EQ(c.classifier_flops, 3 * 2 * 8 * 3 * 3);
  // Every row of the shard keeps its weight and two bf16 moments.
  EXPECT_DOUBLE_EQ(c.classifier_state_memory, 5 * 3 * 2 * 2);
  EXPECT_DOUBLE_EQ(c.grad_all_reduce_bytes, 200);
  // The bf16 buckets come on top of the float32 gradients.
  EXPECT_DOUBLE_EQ(c.backbone_state_memory, 1200 + 200);
}

TEST(StepModel, OneRankCommunicatesNothing) {
  StepShape s = small_step();
  s.ranks = 1;
  const StepCost c = predict_step(s, small_rates());
  EXPECT_EQ(c.class_rows, 10);
  EXPECT_EQ(c.grad_all_reduce, 0.0);
  EXPECT_EQ(c.exposed_all_reduce, 0.0);
  EXPECT_EQ(c.communication(), 0.0);
  EXPECT_DOUBLE_EQ(c.step, c.backbone + c.classifier());
}

TEST(StepModel, ShapeFollowsTheTrainingOptions) {
  TrainConfig config;
  config.batch_size = 64;
  config.precision = Precision::kBf16;
  config.optimizer = OptimizerKind::kAdamW;
  config.classifier_state_dtype = torch::kBFloat16;
  config.grad_comm_dtype = torch::kFloat16;
  config.classifier_workspace = 12345;
  const StepShape s = step_shape(config, 16, 1000000, 42);
  EXPECT_EQ(s.ranks, 16);
  EXPECT_EQ(s.batch_per_rank, 64);
  EXPECT_EQ(s.num_classes, 1000000);
  EXPECT_EQ(s.gemm_bytes, 2);
  EXPECT_EQ(s.classifier_states, 2);
  EXPECT_EQ(s.classifier_state_bytes, 2);
  EXPECT_EQ(s.backbone_states, 2);
  EXPECT_EQ(s.grad_comm_bytes, 2);
  EXPECT_EQ(s.classifier_workspace, 12345);
  EXPECT_EQ(s.backbone_params, 42);
  EXPECT_EQ(s.classifier_weight_bytes, 4);
  EXPECT_EQ(s.classifier_rows, RowSource::kCopy);        // float32 rows, bf16 GEMMs: a copy
  EXPECT_EQ(s.classifier_logits, Logits::kInRegisters);  // bf16, D = 512: the fused kernels
  config.embedding_size = 520;
  EXPECT_EQ(step_shape(config, 1, 10, 1).classifier_logits, Logits::kInMemory);
  config.embedding_size = 512;
  config.fused_classifier = Toggle::kOff;
  EXPECT_EQ(step_shape(config, 1, 10, 1).classifier_logits, Logits::kInMemory);
  config.fused_classifier = Toggle::kAuto;
  config.precision = Precision::kFp32;
  EXPECT_EQ(step_shape(config, 1, 10, 1).gemm_bytes, 4);
  EXPECT_EQ(step_shape(config, 1, 10, 1).classifier_rows, RowSource::kStored);
  config.sample_rate = 0.5;
  EXPECT_EQ(step_shape(config, 1, 10, 1).classifier_rows, RowSource::kCopy);  // Partial FC copies
  config.sample_rate = 1.0;
  // bfloat16 weights halve the shard's memory.
  config.classifier_weight_dtype = torch::kBFloat16;
  const StepShape half = step_shape(config, 16, 1000000, 42);
  EXPECT_EQ(half.classifier_weight_bytes, 2);
  EXPECT_EQ(half.classifier_rows, RowSource::kCopy);  // bf16 rows, float32 GEMMs
  config.precision = Precision::kBf16;
  EXPECT_EQ(step_shape(config, 1, 10, 1).classifier_rows, RowSource::kStored);
  // SGD on bf16 rows fuses the update at global batches up to 384 (64 per rank here), and its
  // bf16 gradient (4 bytes per weight element, written and read) leaves the traffic.
  EXPECT_FALSE(step_shape(config, 4, 1000000, 42).classifier_update_fused);  // AdamW
  config.optimizer = OptimizerKind::kSgd;
  const StepShape fused_update = step_shape(config, 4, 1000000, 42);
  EXPECT_TRUE(fused_update.classifier_update_fused);
  EXPECT_EQ(fused_update.classifier_row_gradient, RowGradientStore::kBFloat16);
  EXPECT_EQ(half.classifier_row_gradient, RowGradientStore::kFloat32);       // float32 GEMMs
  EXPECT_TRUE(step_shape(config, 6, 1000000, 42).classifier_update_fused);   // 384
  EXPECT_FALSE(step_shape(config, 7, 1000000, 42).classifier_update_fused);  // 448
  // SGD's row kernels run where the update is not fused; AdamW has its own.
  EXPECT_FALSE(s.classifier_sgd_rows);
  EXPECT_FALSE(fused_update.classifier_sgd_rows);
  EXPECT_TRUE(step_shape(config, 7, 1000000, 42).classifier_sgd_rows);
  StepShape unfused_update = fused_update;
  unfused_update.classifier_update_fused = false;
  EXPECT_DOUBLE_EQ(predict_step(unfused_update, small_rates()).classifier_traffic -
                       predict_step(fused_update, small_rates()).classifier_traffic,
                   4.0 * 250000 * 512);
  config.fused_update = Toggle::kOn;
  EXPECT_TRUE(step_shape(config, 16, 1000000, 42).classifier_update_fused);
  config.batch_size = 63;  // 252, a global batch the kernel does not take
  EXPECT_FALSE(step_shape(config, 4, 1000000, 42).classifier_update_fused);
  config.batch_size = 64;
  config.fused_update = Toggle::kOff;
  EXPECT_FALSE(step_shape(config, 4, 1000000, 42).classifier_update_fused);
  config.precision = Precision::kFp32;  // float32 GEMMs: no fused kernels
  config.fused_update = Toggle::kAuto;
  EXPECT_FALSE(step_shape(config, 4, 1000000, 42).classifier_update_fused);
  config.precision = Precision::kBf16;
  EXPECT_DOUBLE_EQ(predict_step(half, small_rates()).classifier_weight_memory * 2,
                   predict_step(s, small_rates()).classifier_weight_memory);
}

// The classifier's peak memory in docs/benchmarks.md (2 H200, C = 8M, D = 512, bf16 GEMMs,
// float32 momentum, logits cached): 24.9 GiB at 128 per GPU and 42.0 GiB at 512, within 3%.
TEST(StepModel, ClassifierMemoryNearTheMeasuredH200Peaks) {
  StepShape s;
  s.ranks = 2;
  s.num_classes = 8000000;
  s.embedding_size = 512;
  s.classifier_workspace = int64_t{48} << 30;
  const StepRates r{780e12, 4e12, 265e9, 265e9, 0.0};
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  s.batch_per_rank = 128;
  EXPECT_NEAR(predict_step(s, r).total_memory / kGiB, 24.9, 0.03 * 24.9);
  s.batch_per_rank = 512;
  EXPECT_NEAR(predict_step(s, r).total_memory / kGiB, 42.0, 0.03 * 42.0);
}

// The classifier step of docs/benchmarks.md (myriad-bench classifier, 2 H200, C = 8M, 512 per
// GPU, D = 512, bf16 GEMMs, float32 momentum, logits cached: 52.1 ms of which 1.8 ms
// communication) at the nominal 780 TFLOP/s and 4 TB/s: the model must come within 15%.
TEST(StepModel, ClassifierNearTheMeasuredH200Step) {
  StepShape s;
  s.ranks = 2;
  s.batch_per_rank = 512;
  s.num_classes = 8000000;
  s.embedding_size = 512;
  s.classifier_workspace = int64_t{48} << 30;
  StepRates r;
  r.gemm_flops = 780e12;
  r.memory_bandwidth = 4e12;
  r.all_reduce_busbw = r.all_gather_busbw = 265e9;
  const StepCost c = predict_step(s, r);
  EXPECT_TRUE(c.plan.cache);
  EXPECT_NEAR(c.classifier(), 50.3e-3, 0.15 * 50.3e-3);
}

}  // namespace
}  // namespace myriad
