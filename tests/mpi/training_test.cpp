// Data-parallel training pieces at whatever rank count this binary runs with: gradients summed by
// the bucketed synchroniser equal the single-process gradient of the whole batch, SyncBN makes
// the forward independent of the split, every rank agrees to skip an overflowing step.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "mpi_test.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"
#include "myriad/model/vit.h"
#include "myriad/optim/loss_scaler.h"
#include "myriad/parallel/buffer_broadcast.h"
#include "myriad/parallel/gradient_sync.h"
#include "support/optimizer_check.h"
#include "support/reference_softmax.h"

namespace myriad::testing {
namespace {

class TrainingTest : public BackendTest {
 protected:
  std::shared_ptr<Backbone> make_net(uint64_t seed) {
    torch::manual_seed(seed);
    BackboneOptions o;
    o.name = "smallcnn";
    o.input = {1, 8, 8};
    o.embedding_size = 16;
    auto net = make_backbone(o);
    net->to(device());
    return net;
  }

  std::vector<torch::Tensor> trainable(torch::nn::Module& m) {
    std::vector<torch::Tensor> params;
    for (const torch::Tensor& p : m.parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    return params;
  }
};

// One step of backbone + sharded classifier on W ranks, gradients summed by the bucketed
// synchroniser (tiny buckets, so there are many), against one process running the whole batch
// through an identical backbone whose batch norm sees the whole batch too. Both layouts; the step
// runs twice, so that a gradient added to the previous step's sum would show. The gradients also
// travel compressed (--grad-comm-dtype), within that type's rounding.
TEST_P(TrainingTest, SummedGradientsEqualTheSingleProcessGradient) {
  const ExactFloat32 exact;
  const std::vector<int64_t> counts = [&] {
    std::vector<int64_t> c(world());
    for (int r = 0; r < world(); ++r) c[r] = 3 + r;
    return c;
  }();
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t begin = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
  torch::manual_seed(5);
  const torch::Tensor images = torch::randn({n, 1, 8, 8});
  const torch::Tensor labels = torch::randint(0, 13, {n}, torch::kInt64);

  struct Case {
    bool channels_last;
    torch::ScalarType wire;
    double tolerance;  // of the whole gradient's norm
  };
  // bf16 keeps 8 bits of mantissa, fp16 11: each rank's part and the sum round once or twice.
  for (const Case& c : {Case{false, torch::kFloat32, 1e-5}, Case{true, torch::kFloat32, 1e-5},
                        Case{false, torch::kBFloat16, 1e-2}, Case{false, torch::kFloat16, 2e-3}}) {
    const bool channels_last = c.channels_last;
    SCOPED_TRACE(std::string(channels_last ? "channels-last" : "NCHW") + ", gradients sent as " +
                 c10::toString(c.wire));
    auto net = make_net(17);
    net->set_channels_last(channels_last);
    auto comm_bn = environment().comms->create(device());
    set_batch_norm_sync(*net, comm_bn.get());
    GradientSynchronizer sync(trainable(*net), environment().comms->create(device()), 256, c.wire);
    EXPECT_GT(sync.bucket_count(), 2);
    ShardedSoftmaxOptions o;
    o.num_classes = 13;
    o.embedding_size = 16;
    o.update = WeightUpdate::kAccumulateGrad;
    ShardedMarginSoftmax classifier(comm(), o, device());
    torch::Tensor loss;
    for (int repeat = 0; repeat < 2; ++repeat) {
      sync.clear_gradients();
      const torch::Tensor features =
          net->forward(net->in_layout(images.slice(0, begin, begin + counts[rank()]).to(device())));
      loss =
          classifier.forward(features, labels.slice(0, begin, begin + counts[rank()]).to(device()));
      loss.backward();
      sync.finish();
    }

    // The reference: the same network, one process, the whole batch.
    auto reference = make_net(17);
    reference->to(torch::kCPU);
    const torch::Tensor all_features = reference->forward(images);
    // The classifier's weight is identical on any world size: gather this rank's shard for the
    // reference softmax.
    const torch::Tensor weight =
        comm().all_gather(classifier.weight(), classifier.partition().sizes()).cpu();
    const ReferenceResult ref = reference_softmax(all_features.detach(), labels, weight, o.margin);
    all_features.backward(ref.grad_features.to(torch::kFloat32));
    EXPECT_LE(relative_error(loss, ref.loss), 1e-5);
    const auto mine = trainable(*net);
    const auto theirs = trainable(*reference);
    ASSERT_EQ(mine.size(), theirs.size());
    // Errors are measured against the whole gradient: some entries are zero up to rounding (a bias
    // followed by batch norm), so their own relative error means nothing.
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& p : theirs) flat.push_back(p.grad().reshape(-1));
    const double scale = torch::cat(flat).norm().item<double>();
    double squared_error = 0.0;
    for (size_t k = 0; k < mine.size(); ++k) {
      const double error = (mine[k].grad().cpu() - theirs[k].grad()).norm().item<double>();
      squared_error += error * error;
      EXPECT_LE(error, c.tolerance * scale) << "parameter " << k << " of " << mine.size();
      // The gradient is the parameter's own layout, not a transposed copy.
      EXPECT_EQ(mine[k].grad().strides(), mine[k].strides()) << "parameter " << k;
    }
    // A compressed all-reduce really rounds (float32 differs from the reference by far less).
    if (c.wire != torch::kFloat32) {
      EXPECT_GT(std::sqrt(squared_error), 1e-6 * scale);
    }
    // Averaging instead of summing would be off by the world size.
    if (world() > 1) {
      EXPECT_GT((mine[0].grad().cpu() / world() - theirs[0].grad()).norm().item<double>(),
                1e-2 * scale);
    }
  }
}

// With SyncBN the batch statistics, and so the loss, are those of the global batch.
TEST_P(TrainingTest, SyncBatchNormUsesGlobalStatistics) {
  const int64_t per_rank = 4;
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({per_rank * world(), 6, 3, 3}) * 2 + 1;
  BatchNorm bn(6);
  bn->to(device());
  auto sync_comm = environment().comms->create(device());
  bn->sync = sync_comm.get();
  // A random projection of the output: sum(y^2) would have a zero gradient.
  const torch::Tensor projection = torch::randn(x.sizes());
  const torch::Tensor my_projection =
      projection.slice(0, rank() * per_rank, (rank() + 1) * per_rank).to(device());
  torch::Tensor mine =
      x.slice(0, rank() * per_rank, (rank() + 1) * per_rank).to(device()).requires_grad_(true);
  const torch::Tensor y = bn->forward(mine);
  (y * my_projection).sum().backward();

  BatchNorm local(6);
  torch::Tensor all = x.clone().requires_grad_(true);
  const torch::Tensor y_all = local->forward(all);
  (y_all * projection).sum().backward();
  EXPECT_LE(relative_error(y, y_all.slice(0, rank() * per_rank, (rank() + 1) * per_rank)), 1e-5);
  EXPECT_LE(
      relative_error(mine.grad(), all.grad().slice(0, rank() * per_rank, (rank() + 1) * per_rank)),
      1e-4);
  EXPECT_LE(relative_error(bn->running_var, local->running_var), 1e-5);
  torch::Tensor weight_grad = bn->weight.grad().clone();
  comm().all_reduce(weight_grad);
  EXPECT_LE(relative_error(weight_grad, local->weight.grad()), 1e-4);
}

// ViT's token masking and drop path draw from the samples' keys: on W ranks, each running its
// slice of the global batch with its samples' keys, forward and the summed gradients are those of
// one process running the whole batch (SyncBN for the head's batch norms). High rates make the
// randomness matter; other keys must change the result, or the check could not fail.
TEST_P(TrainingTest, VitOnWRanksComputesWhatOneRankComputes) {
  const ExactFloat32 exact;
  VitConfig config;
  config.dim = 32;
  config.depth = 3;
  config.heads = 4;
  config.mlp_ratio = 2;
  config.drop_path = 0.5;
  config.mask_ratio = 0.3;
  config.patch = 4;
  BackboneOptions o;
  o.name = "vit";
  o.input = {3, 16, 16};
  o.embedding_size = 8;
  o.seed = 11;
  const auto make_vit = [&] {
    torch::manual_seed(23);
    return std::make_shared<Vit>(o, config);
  };
  const int64_t per_rank = 3, n = per_rank * world();
  const int64_t begin = per_rank * rank();
  torch::manual_seed(5);
  const torch::Tensor images = torch::randn({n, 3, 16, 16});
  const torch::Tensor keys = torch::arange(1000, 1000 + n, torch::kInt64);
  const torch::Tensor projection = torch::randn({n, 8});

  for (const bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "activation checkpointing" : "plain");
    auto net = make_vit();
    net->to(device());
    net->set_activation_checkpointing(checkpointing);
    auto comm_bn = environment().comms->create(device());
    set_batch_norm_sync(*net, comm_bn.get());
    GradientSynchronizer sync(trainable(*net), environment().comms->create(device()), 4096);
    const torch::Tensor features =
        net->forward(images.slice(0, begin, begin + per_rank).to(device()),
                     keys.slice(0, begin, begin + per_rank).to(device()));
    (features * projection.slice(0, begin, begin + per_rank).to(device())).sum().backward();
    sync.finish();

    auto reference = make_vit();
    const torch::Tensor all = reference->forward(images, keys);
    (all * projection).sum().backward();
    EXPECT_LE(relative_error(comm().all_gather(features.detach()).cpu(), all.detach()), 1e-5);
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& p : trainable(*reference)) flat.push_back(p.grad().reshape(-1));
    const double scale = torch::cat(flat).norm().item<double>();
    const auto mine = trainable(*net);
    const auto theirs = trainable(*reference);
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_LE((mine[k].grad().cpu() - theirs[k].grad()).norm().item<double>(), 1e-5 * scale)
          << "parameter " << k;
    }
    torch::NoGradGuard no_grad;
    const torch::Tensor other = make_vit()->forward(images, keys + n);
    EXPECT_GT(relative_error(other, all.detach()), 1e-3) << "other keys, the same result";
  }
}

// The buckets as a CUDA graph's backward fills them (StageGraphs): gradients added straight into
// gradient_views() over two passes, pass_replayed() after each, leave in .grad after finish() the
// sum over the passes and the ranks, as the hooks would; a backward while the hooks are paused
// (a graph's warm-up) leaves the buckets alone.
TEST_P(TrainingTest, BucketsFilledWithoutHooksSumOverPassesAndRanks) {
  const auto options = torch::dtype(torch::kFloat32).device(device());
  std::vector<torch::Tensor> params = {torch::randn({5, 3}, options).requires_grad_(true),
                                       torch::randn({7}, options).requires_grad_(true),
                                       torch::randn({4, 2}, options).requires_grad_(true)};
  GradientSynchronizer sync(params, environment().comms->create(device()), 32);
  EXPECT_GT(sync.bucket_count(), 1);
  std::vector<torch::Tensor> want(params.size());
  sync.zero_buckets();
  std::optional<GradientSynchronizer::PausedHooks> paused(sync);
  (params[0].sum() * 1000.0 + params[2].sum()).backward();
  const std::vector<torch::Tensor> views = sync.gradient_views();
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < params.size(); ++k) {
      torch::manual_seed(100 * pass + 10 * k + rank());
      const torch::Tensor g = torch::randn(params[k].sizes(), options);
      torch::NoGradGuard no_grad;
      views[k].add_(g);
      // What every rank adds, summed on this one: the seeds are known.
      for (int r = 0; r < world(); ++r) {
        torch::manual_seed(100 * pass + 10 * k + r);
        const torch::Tensor theirs = torch::randn(params[k].sizes(), options);
        want[k] = want[k].defined() ? want[k] + theirs : theirs;
      }
    }
    sync.pass_replayed(pass == 1, /*all_reduced=*/false);
  }
  paused.reset();
  sync.finish();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_LE(relative_error(params[k].grad(), want[k]), 1e-6) << "parameter " << k;
  }
}

TEST_P(TrainingTest, EveryRankSkipsWhenOneRankOverflows) {
  torch::Tensor p = torch::ones({4}, torch::device(device())).requires_grad_(true);
  p.mutable_grad() = torch::full({4}, 2.0, torch::device(device()));
  if (rank() == world() - 1) p.mutable_grad()[1] = std::numeric_limits<float>::infinity();
  DynamicLossScaler scaler(device(), 1024.0, 2);
  EXPECT_EQ(scaler.scale().device(), device());
  scaler.update(scaler.unscale({p.grad()}, comm()));
  EXPECT_DOUBLE_EQ(scaler.scale_value(), 512.0);
  EXPECT_EQ(scaler.take_report().skipped_steps, 1);
  const DynamicLossScaler::Report again = scaler.take_report();
  EXPECT_EQ(again.skipped_steps, 0);  // each skip is reported once
  EXPECT_DOUBLE_EQ(again.scale, 512.0);
  // Clean steps grow the scale back after the interval.
  p.mutable_grad() = torch::full({4}, 2.0, torch::device(device()));
  scaler.update(scaler.unscale({p.grad()}, comm()));
  EXPECT_NEAR(p.grad()[0].item<double>(), 2.0 / 512.0, 1e-12);
  EXPECT_EQ(scaler.clean_steps(), 1);
  p.mutable_grad() = torch::full({4}, 2.0, torch::device(device()));
  scaler.update(scaler.unscale({p.grad()}, comm()));
  EXPECT_DOUBLE_EQ(scaler.scale_value(), 1024.0);
  EXPECT_EQ(scaler.clean_steps(), 0);
  EXPECT_EQ(scaler.take_report().skipped_steps, 0);
}

// The scale on the device follows the host rule (halve after an overflow, not below 1; double
// after `interval` clean steps in a row) over a random sequence of overflows.
TEST_P(TrainingTest, LossScaleFollowsTheRuleOverManySteps) {
  DynamicLossScaler scaler(device(), 8.0, 3);
  scaler.set_state(4.0, 1);
  double scale = 4.0;
  int64_t clean = 1, skipped = 0;
  std::mt19937 random(11);
  for (int step = 0; step < 60; ++step) {
    const bool overflow = random() % 4 == 0;
    scaler.update(torch::full({1}, overflow ? 1.0 : 0.0, torch::device(device())));
    if (overflow) {
      scale = std::max(1.0, scale * 0.5);
      clean = 0;
      ++skipped;
    } else if (++clean >= 3) {
      scale *= 2.0;
      clean = 0;
    }
    ASSERT_DOUBLE_EQ(scaler.scale_value(), scale) << "step " << step;
    ASSERT_DOUBLE_EQ(scaler.inverse_scale().item<double>(), 1.0 / scale) << "step " << step;
    ASSERT_EQ(scaler.clean_steps(), clean) << "step " << step;
  }
  EXPECT_EQ(scaler.take_report().skipped_steps, skipped);
}

// The backbone optimizers on this backend's device (on GPUs, SGD through ATen's fused kernel and
// a skip decided on the device) against LibTorch's own on the CPU.
TEST_P(TrainingTest, MultiTensorOptimizersMatchLibTorch) {
  expect_multi_tensor_optimizers_match(device());
}

TEST_P(TrainingTest, BroadcastMakesReplicasIdentical) {
  auto net = make_net(100 + rank());
  std::vector<torch::Tensor> state = net->parameters();
  for (const torch::Tensor& b : net->buffers()) state.push_back(b);
  broadcast_tensors(state, comm());
  auto rank0 = make_net(100);
  const auto a = net->parameters();
  const auto b = rank0->parameters();
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::equal(a[k].cpu(), b[k].cpu())) << k;
}

// The buffers keep their values when they move into the flat tensors, and each broadcast gives
// every rank rank 0's, also after in-place updates such as batch norm's; a buffer that was given
// storage of its own afterwards is refused on every rank alike.
TEST_P(TrainingTest, BufferBroadcastFollowsRankZero) {
  const auto on = torch::device(device());
  const auto rank_values = [&](int r) {
    return std::vector<torch::Tensor>{
        torch::arange(3, on.dtype(torch::kFloat32)) + r, torch::full({2, 2}, 10.0 * (r + 1), on),
        torch::full({}, static_cast<int64_t>(5 + r), on.dtype(torch::kInt64)),
        torch::full({4}, -1.0 - r, on.dtype(torch::kFloat64))};
  };
  std::vector<torch::Tensor> buffers = rank_values(rank());
  const std::vector<torch::Tensor> mine = rank_values(rank());
  const std::vector<torch::Tensor> first = rank_values(0);
  BufferBroadcast broadcast(buffers, comm());
  for (size_t k = 0; k < buffers.size(); ++k) EXPECT_TRUE(torch::equal(buffers[k], mine[k])) << k;
  broadcast.broadcast();
  for (size_t k = 0; k < buffers.size(); ++k) EXPECT_TRUE(torch::equal(buffers[k], first[k])) << k;

  buffers[0].mul_(0.5).add_(rank());
  buffers[2].add_(1);
  broadcast.broadcast();
  EXPECT_TRUE(torch::equal(buffers[0], first[0] * 0.5));
  EXPECT_EQ(buffers[2].item<int64_t>(), 6);
  EXPECT_TRUE(torch::equal(buffers[3], first[3]));

  if (world() == 1) return;  // one replica: the buffers never moved
  buffers[1].set_(torch::zeros({2, 2}, on));
  EXPECT_THROW(broadcast.broadcast(), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, TrainingTest, ::testing::Values("mpi", "nccl"), backend_name);

}  // namespace
}  // namespace myriad::testing
