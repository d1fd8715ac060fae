// The sharded margin softmax against the single-process float64 reference, at whatever rank
// count this binary runs with, on the CPU (MPI) and, where every rank has a GPU, on CUDA (NCCL).

#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "mpi_test.h"
#include "myriad/classifier/partial_fc.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/util/error.h"
#include "support/reference_softmax.h"

#ifdef MYRIAD_EXPECT_HOPPER_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

namespace myriad::testing {
namespace {

// The fused kernels are the default path on compute capability 9.0 (H100, H200) in a build that
// has them; read from the device here rather than from the classifier's own test of it.
bool hopper_build_on_hopper_gpu(const torch::Device& device) {
#ifdef MYRIAD_EXPECT_HOPPER_KERNELS
  if (!device.is_cuda()) return false;
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(
      device.has_index() ? device.index() : at::cuda::current_device());
  return props->major == 9 && props->minor == 0;
#else
  (void)device;
  return false;
#endif
}

constexpr double kTolerance = 1e-5;

MarginConfig margin_of(MarginType type, double m1, double m2, double m3,
                       bool straight_through = false) {
  MarginConfig m;
  m.type = type;
  m.scale = type == MarginType::kSoftmax ? 1.0 : 64.0;
  m.m1 = m1;
  m.m2 = m2;
  m.m3 = m3;
  m.straight_through = straight_through;
  return m;
}

std::vector<MarginConfig> every_margin() {
  return {margin_of(MarginType::kSoftmax, 1, 0, 0),
          margin_of(MarginType::kArcFace, 1, 0.5, 0),
          margin_of(MarginType::kArcFace, 1, 0.5, 0, true),
          margin_of(MarginType::kCosFace, 1, 0, 0.4),
          margin_of(MarginType::kSphereFace, 1.7, 0, 0),
          margin_of(MarginType::kSphereFace, 4.0, 0, 0, true),
          margin_of(MarginType::kCombined, 1.2, 0.3, 0.15)};
}

// Uneven local batches: 5, 3, 8, 6, ... rows.
std::vector<int64_t> uneven_batches(int world) {
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = 2 + (5 * r + 3) % 7;
  return counts;
}

struct Problem {
  torch::Tensor features;  // [N, D] float32, identical on every rank
  torch::Tensor labels;    // [N]
  torch::Tensor weight;    // [C, D]
  std::vector<int64_t> counts;
};

Problem make_problem(const std::vector<int64_t>& counts, int64_t classes, int64_t dim,
                     uint64_t seed) {
  torch::manual_seed(seed);
  Problem p;
  p.counts = counts;
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  p.features = torch::randn({n, dim});
  p.labels = torch::randint(0, classes, {n}, torch::kInt64);
  p.weight = torch::randn({classes, dim}) * 0.1;
  return p;
}

class ClassifierTest : public BackendTest {
 protected:
  // Per-class budget that makes chunks of `rows` classes for this problem when the GEMMs read
  // copies of the rows, and of a few more when they read the stored rows (or keep fewer bytes
  // than `logits` and `row_gradient` say).
  static int64_t budget_for_chunk(int64_t rows, int64_t batch, int64_t dim, int64_t gemm_bytes = 4,
                                  RowSource source = RowSource::kCopy,
                                  Logits logits = Logits::kInMemory,
                                  RowGradientStore row_gradient = RowGradientStore::kFloat32) {
    return rows * (chunk_cached_bytes_per_row(batch, dim, gemm_bytes, source, logits) +
                   chunk_work_bytes_per_row(batch, dim, gemm_bytes, row_gradient));
  }

  ShardedSoftmaxOptions options_for(const Problem& p, const MarginConfig& margin) {
    ShardedSoftmaxOptions o;
    o.num_classes = p.weight.size(0);
    o.embedding_size = p.weight.size(1);
    o.margin = margin;
    o.update = WeightUpdate::kAccumulateGrad;
    o.workspace_bytes = int64_t{1} << 30;
    return o;
  }

  int64_t local_begin(const Problem& p) {
    return std::accumulate(p.counts.begin(), p.counts.begin() + rank(), int64_t{0});
  }

  torch::Tensor local_rows(const Problem& p, const torch::Tensor& t) {
    return t.slice(0, local_begin(p), local_begin(p) + p.counts[rank()]);
  }

  std::unique_ptr<ShardedMarginSoftmax> make_module(const Problem& p,
                                                    const ShardedSoftmaxOptions& o) {
    auto module = std::make_unique<ShardedMarginSoftmax>(comm(), o, device());
    const ClassPartition& part = module->partition();
    module->weight().copy_(
        p.weight.slice(0, part.offset(rank()), part.offset(rank()) + part.size(rank())));
    return module;
  }

  struct Outcome {
    torch::Tensor loss;
    torch::Tensor grad_features;
  };

  Outcome run_step(ShardedMarginSoftmax& module, const Problem& p) {
    torch::Tensor x = local_rows(p, p.features).to(device()).requires_grad_(true);
    torch::Tensor loss = module.forward(x, local_rows(p, p.labels).to(device()));
    loss.backward();
    return {loss.detach().cpu(), x.grad().cpu()};
  }

  // The loss must be the same number on every rank.
  void expect_same_loss_everywhere(const torch::Tensor& loss) {
    torch::Tensor all =
        MpiTest::comm(torch::kCPU).all_gather(loss.reshape({1}).to(torch::kFloat32));
    EXPECT_EQ(all.max().item<float>(), all.min().item<float>()) << all;
  }

  void expect_matches_reference(const Problem& p, const ShardedSoftmaxOptions& o, double tolerance,
                                const std::string& label) {
    auto module = make_module(p, o);
    const Outcome out = run_step(*module, p);
    const ReferenceResult ref = reference_softmax(p.features, p.labels, p.weight, o.margin);
    const ClassPartition& part = module->partition();
    EXPECT_LE(relative_error(out.loss, ref.loss), tolerance)
        << label << ": loss " << out.loss.item<float>() << " vs " << ref.loss.item<double>();
    EXPECT_LE(relative_error(out.grad_features, local_rows(p, ref.grad_features)), tolerance)
        << label << ": grad_features";
    EXPECT_LE(relative_error(module->weight_grad(),
                             ref.grad_weight.slice(0, part.offset(rank()),
                                                   part.offset(rank()) + part.size(rank()))),
              tolerance)
        << label << ": grad_weight";
    expect_same_loss_everywhere(out.loss);
  }

  struct SgdReference {
    torch::Tensor weight, momentum;  // float64, every class
    torch::Tensor touched;           // which classes a step sampled
  };

  // torch.optim.SGD's rule (momentum, weight decay added to the gradient, Nesterov) applied to
  // the float64 reference gradient for `steps` steps, from the initial weights as o stores them;
  // with Partial FC only the rows each step samples change.
  static SgdReference reference_sgd(const Problem& p, const ShardedSoftmaxOptions& o, int steps) {
    const int64_t classes = p.weight.size(0);
    SgdReference r;
    r.weight = p.weight.to(o.weight_dtype).to(torch::kFloat64);
    r.momentum = torch::zeros_like(r.weight);
    r.touched = torch::zeros({classes}, torch::kBool);
    const OptimizerOptions& opt = o.optimizer;
    for (int64_t step = 1; step <= steps; ++step) {
      torch::Tensor active;
      if (o.sample_rate < 1.0)
        active = sample_class_rows(p.labels, classes, 0, o.sample_rate, o.seed, step);
      const ReferenceResult ref =
          reference_softmax(p.features, p.labels, r.weight.to(torch::kFloat32), o.margin, active);
      const torch::Tensor rows = active.defined() ? active : torch::arange(classes);
      const torch::Tensor g =
          ref.grad_weight.index_select(0, rows) + opt.weight_decay * r.weight.index_select(0, rows);
      const torch::Tensor b = r.momentum.index_select(0, rows) * opt.momentum + g;
      r.momentum.index_copy_(0, rows, b);
      const torch::Tensor d = opt.nesterov ? g + opt.momentum * b : b;
      r.weight.index_copy_(0, rows, r.weight.index_select(0, rows) - opt.lr * d);
      r.touched.index_fill_(0, rows, true);
    }
    return r;
  }
};

TEST_P(ClassifierTest, MatchesReferenceForEveryMarginChunkedAndNot) {
  const Problem p = make_problem(uneven_batches(world()), 37, 16, 11);
  const int64_t batch = p.features.size(0);
  for (const MarginConfig& margin : every_margin()) {
    ShardedSoftmaxOptions o = options_for(p, margin);
    expect_matches_reference(p, o, kTolerance, margin.describe() + ", whole shard, cached");
    o.workspace_bytes = budget_for_chunk(3, batch, 16);
    expect_matches_reference(p, o, kTolerance, margin.describe() + ", chunks of 3 classes");
  }
}

TEST_P(ClassifierTest, PlansCacheOrChunksFromTheBudget) {
  const Problem p = make_problem(uneven_batches(world()), 37, 16, 12);
  ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  // float32 rows and GEMMs: the GEMMs read the stored rows, and the budget counts no copy.
  o.workspace_bytes = budget_for_chunk(3, p.features.size(0), 16, 4, RowSource::kStored);
  auto module = make_module(p, o);
  run_step(*module, p);
  EXPECT_FALSE(module->last_plan().cache);
  EXPECT_EQ(module->last_plan().chunk_rows, 3);
  o.sample_rate = 0.5;  // Partial FC's rows are copied: fewer fit
  module = make_module(p, o);
  run_step(*module, p);
  EXPECT_LT(module->last_plan().chunk_rows, 3);
  // bf16 rows under bf16 GEMMs, updated by the row kernels: on the GPU the plan counts the rows'
  // gradient in bf16, as the buffer holds it (row_gradient_store); counted in float32, 2 rows
  // would fit. The CPU's row loop forms each row's gradient itself: counted at all, 2 would fit.
  o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  o.gemm_dtype = o.weight_dtype = torch::kBFloat16;
  o.update = WeightUpdate::kFused;
  o.fused_kernels = FusedKernels::kOff;
  o.workspace_bytes =
      budget_for_chunk(3, p.features.size(0), 16, 2, RowSource::kStored, Logits::kInMemory,
                       device().is_cuda() ? RowGradientStore::kBFloat16 : RowGradientStore::kNone);
  module = make_module(p, o);
  run_step(*module, p);
  EXPECT_EQ(module->last_plan().chunk_rows, 3);
}

TEST_P(ClassifierTest, RankWithoutSamples) {
  std::vector<int64_t> counts = uneven_batches(world());
  counts[world() - 1] = 0;
  if (world() == 1) counts[0] = 4;
  const Problem p = make_problem(counts, 23, 8, 13);
  expect_matches_reference(p, options_for(p, margin_of(MarginType::kCombined, 1.1, 0.2, 0.1)),
                           kTolerance, "a rank without samples");
}

// bfloat16 and float16 GEMM operands round the normalised features and weights to 8 and 11
// significant bits; docs/classifier.md records these tolerances.
TEST_P(ClassifierTest, HalfPrecisionGemmsWithinDocumentedTolerance) {
  const Problem p = make_problem(uneven_batches(world()), 41, 32, 14);
  for (auto [dtype, tolerance] :
       {std::pair{torch::kBFloat16, 3e-2}, std::pair{torch::kFloat16, 5e-3}}) {
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.gemm_dtype = dtype;
    expect_matches_reference(p, o, tolerance, c10::toString(dtype));
    o.workspace_bytes = budget_for_chunk(5, p.features.size(0), 32, 2);
    expect_matches_reference(p, o, tolerance, std::string(c10::toString(dtype)) + " chunked");
  }
  // bfloat16 weights with bfloat16 GEMMs: the GEMMs read the stored rows and the logits are scaled
  // by 1/|w| afterwards. The reference starts from the same, rounded, weights.
  Problem rounded = p;
  rounded.weight = p.weight.to(torch::kBFloat16).to(torch::kFloat32);
  for (const MarginConfig& margin :
       {margin_of(MarginType::kArcFace, 1, 0.5, 0), margin_of(MarginType::kSoftmax, 1, 0, 0)}) {
    ShardedSoftmaxOptions o = options_for(rounded, margin);
    o.gemm_dtype = torch::kBFloat16;
    o.weight_dtype = torch::kBFloat16;
    const std::string label = "bf16 weights, " + margin.describe();
    expect_matches_reference(rounded, o, 3e-2, label);
    o.workspace_bytes = budget_for_chunk(5, p.features.size(0), 32, 2);
    expect_matches_reference(rounded, o, 3e-2, label + " chunked");
  }
}

// bfloat16 GEMMs for every margin, whole and chunked, with float32 and bfloat16 weights: on an
// H100 or H200 the fused kernels run them (logits never in memory), elsewhere the GEMMs and
// softmax kernels do; both within the bfloat16 tolerance of the float64 reference, the fused
// path bit for bit across reruns, and within bfloat16 rounding of the other path. D = 40 and
// 300 classes leave partial tiles of K and of classes.
TEST_P(ClassifierTest, Bf16GemmsForEveryMarginOnEitherKernelPath) {
  Problem p = make_problem(uneven_batches(world()), 300, 40, 23);
  p.weight = p.weight.to(torch::kBFloat16).to(torch::kFloat32);
  for (const MarginConfig& margin : every_margin()) {
    for (torch::ScalarType weight_dtype : {torch::kFloat32, torch::kBFloat16}) {
      ShardedSoftmaxOptions o = options_for(p, margin);
      o.gemm_dtype = torch::kBFloat16;
      o.weight_dtype = weight_dtype;
      for (bool chunked : {false, true}) {
        // Budgeted as the fused plan counts (no logits in memory), so that a shard of 75 to 300
        // rows stays in chunks of 70 at every world size, on either path.
        if (chunked)
          o.workspace_bytes = budget_for_chunk(
              70, p.features.size(0), 40, 2,
              weight_dtype == torch::kBFloat16 ? RowSource::kStored : RowSource::kCopy,
              Logits::kInRegisters);
        const std::string label = margin.describe() + ", " + c10::toString(weight_dtype) +
                                  (chunked ? " weights, chunked" : " weights");
        expect_matches_reference(p, o, 3e-2, label);
        auto fused = make_module(p, o);
        EXPECT_EQ(fused->fused(), hopper_build_on_hopper_gpu(device()))
            << label << ": " << fused->kernels();
        const Outcome first = run_step(*fused, p);
        // Whole, the fused kernels keep the exponentials for backward; chunked, they recompute.
        EXPECT_EQ(fused->last_plan().kept_exponentials, fused->fused() && !chunked) << label;
        if (chunked) {
          EXPECT_GT(fused->last_plan().chunks, 1) << label;
        }
        const torch::Tensor first_grad = fused->weight_grad().cpu();
        fused->zero_grad();
        const Outcome again = run_step(*fused, p);
        EXPECT_TRUE(torch::equal(first.loss, again.loss) &&
                    torch::equal(first.grad_features, again.grad_features) &&
                    torch::equal(first_grad, fused->weight_grad().cpu()))
            << label << ": a rerun differs (" << fused->kernels() << ")";
        ShardedSoftmaxOptions generic_options = o;
        generic_options.fused_kernels = FusedKernels::kOff;
        auto generic = make_module(p, generic_options);
        EXPECT_FALSE(generic->fused());
        const Outcome other = run_step(*generic, p);
        EXPECT_LE(relative_error(first.loss, other.loss), 1e-2) << label;
        EXPECT_LE(relative_error(first.grad_features, other.grad_features), 2e-2) << label;
        EXPECT_LE(relative_error(first_grad, generic->weight_grad().cpu()), 2e-2) << label;
      }
    }
  }
}

// Every sample along e0 and every class row at -0.6 on it: the logits lie far below the
// reference the exponentials are kept against, where exp(z - r) underflows, so the kept
// exponentials would give no gradient off the targets (each about 1/300 of the softmax);
// backward must recompute the logits. ArcFace: every logit near -44 against s = 64. Plain
// softmax, features of norm 100: every logit -60 against a bound |x| max |w| of at least +60.
// Each product has one nonzero term, exact in bf16, so only the gradient's bf16 rounding
// separates the fused path from the reference.
TEST_P(ClassifierTest, KeptExponentialsGiveWayToRecomputationWhereRowsLieDeep) {
  Problem p = make_problem(uneven_batches(world()), 300, 40, 29);
  p.weight.select(1, 0).fill_(-0.6);
  p.weight = p.weight.to(torch::kBFloat16).to(torch::kFloat32);
  for (const auto& [margin, length] :
       {std::pair{margin_of(MarginType::kArcFace, 1, 0.5, 0), 1.0},
        std::pair{margin_of(MarginType::kSoftmax, 1, 0, 0), 100.0}}) {
    p.features.zero_();
    p.features.select(1, 0).fill_(length);
    ShardedSoftmaxOptions o = options_for(p, margin);
    o.gemm_dtype = torch::kBFloat16;
    o.weight_dtype = torch::kBFloat16;
    const std::string label = "rows deep below the reference, " + margin.describe();
    expect_matches_reference(p, o, 1e-2, label);
    auto module = make_module(p, o);
    run_step(*module, p);
    EXPECT_EQ(module->last_plan().kept_exponentials, module->fused()) << label;
  }
}

// A forward under no_grad (an evaluation) keeps nothing for a backward, the fused kernels'
// exponentials included; its loss is a training forward's at the same step, bit for bit; and the
// training step after it is a fresh classifier's: with Partial FC, it samples the classes it would
// have.
TEST_P(ClassifierTest, AForwardWithoutGradientKeepsNothingForBackward) {
  const Problem p = make_problem(uneven_batches(world()), 120, 24, 31);
  const auto bf16 = [](ShardedSoftmaxOptions o) {
    o.gemm_dtype = torch::kBFloat16;
    o.weight_dtype = torch::kBFloat16;
    return o;
  };
  const auto partial = [](ShardedSoftmaxOptions o) {
    o.sample_rate = 0.3;
    o.seed = 5;
    return o;
  };
  const ShardedSoftmaxOptions arcface = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  const ShardedSoftmaxOptions softmax = options_for(p, margin_of(MarginType::kSoftmax, 1, 0, 0));
  for (const ShardedSoftmaxOptions& o :
       {arcface, softmax, bf16(arcface), bf16(softmax), partial(arcface), partial(bf16(arcface))}) {
    const std::string label = str_format("{}, {} GEMMs, sample rate {}", o.margin.describe(),
                                         c10::toString(o.gemm_dtype), o.sample_rate);
    const torch::Tensor x = local_rows(p, p.features).to(device());
    const torch::Tensor y = local_rows(p, p.labels).to(device());
    auto trained = make_module(p, o);
    const torch::Tensor with_grad = trained->forward(x.clone().requires_grad_(true), y).detach();
    EXPECT_TRUE(trained->last_plan().cache) << label;
    EXPECT_EQ(trained->last_plan().kept_exponentials, trained->fused()) << label;
    auto module = make_module(p, o);
    torch::Tensor without;
    {
      torch::NoGradGuard no_grad;
      without = module->forward(x, y);
    }
    EXPECT_FALSE(module->last_plan().cache) << label;
    EXPECT_FALSE(module->last_plan().kept_exponentials) << label;
    EXPECT_EQ(module->steps(), 0) << label;
    EXPECT_TRUE(torch::equal(with_grad, without)) << label << ": " << with_grad << " " << without;
    // Training goes on as if that forward had not been.
    const Outcome after = run_step(*module, p);
    const Outcome fresh = run_step(*make_module(p, o), p);
    EXPECT_TRUE(torch::equal(after.loss, fresh.loss) &&
                torch::equal(after.grad_features, fresh.grad_features))
        << label;
  }
}

TEST_P(ClassifierTest, PartialFcUsesTheSameClassesAtEveryWorldSize) {
  const Problem p = make_problem(uneven_batches(world()), 97, 16, 15);
  ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  o.sample_rate = 0.3;
  o.seed = 77;
  o.workspace_bytes = budget_for_chunk(4, p.features.size(0), 16);
  auto module = make_module(p, o);
  const Outcome out = run_step(*module, p);
  // The single-process choice: one shard holding every class, at the same step (1).
  const torch::Tensor active = sample_class_rows(p.labels, 97, 0, 0.3, 77, 1);
  EXPECT_LT(active.size(0), 97);
  const ReferenceResult ref = reference_softmax(p.features, p.labels, p.weight, o.margin, active);
  const ClassPartition& part = module->partition();
  EXPECT_LE(relative_error(out.loss, ref.loss), kTolerance);
  EXPECT_LE(relative_error(out.grad_features, local_rows(p, ref.grad_features)), kTolerance);
  EXPECT_LE(relative_error(module->weight_grad(),
                           ref.grad_weight.slice(0, part.offset(rank()),
                                                 part.offset(rank()) + part.size(rank()))),
            kTolerance);
}

// One and two fused SGD steps against torch.optim.SGD's rule applied to the reference gradient,
// with float32 or bfloat16 momentum and weights.
TEST_P(ClassifierTest, FusedSgdMatchesReferenceAndTouchesOnlySampledRows) {
  const Problem p = make_problem(uneven_batches(world()), 53, 16, 16);
  const std::vector<std::pair<torch::ScalarType, torch::ScalarType>> storage = {
      {torch::kFloat32, torch::kFloat32},
      {torch::kBFloat16, torch::kFloat32},
      {torch::kBFloat16, torch::kBFloat16}};
  for (double rate : {1.0, 0.4}) {
    for (const auto& [state, weight_dtype] : storage) {
      ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kCosFace, 1, 0, 0.35));
      o.update = WeightUpdate::kFused;
      o.sample_rate = rate;
      o.seed = 5;
      o.workspace_bytes = budget_for_chunk(4, p.features.size(0), 16);
      o.optimizer.lr = 0.5;
      o.optimizer.momentum = 0.9;
      o.optimizer.weight_decay = 0.01;
      o.optimizer.state_dtype = state;
      o.weight_dtype = weight_dtype;
      auto module = make_module(p, o);
      const ClassPartition& part = module->partition();
      const int64_t offset = part.offset(rank()), rows = part.size(rank());

      for (int step = 1; step <= 2; ++step) run_step(*module, p);
      const SgdReference ref = reference_sgd(p, o, 2);
      const torch::Tensor w = ref.weight, buf = ref.momentum, touched = ref.touched;
      const torch::Tensor initial_all = p.weight.to(weight_dtype).to(torch::kFloat32);
      const double tolerance =
          state == torch::kBFloat16 || weight_dtype == torch::kBFloat16 ? 1e-2 : kTolerance;
      const std::string label = str_format("rate {}, state {}, weights {}", rate,
                                           c10::toString(state), c10::toString(weight_dtype));
      ASSERT_EQ(module->weight().scalar_type(), weight_dtype) << label;
      EXPECT_LE(
          relative_error(module->weight().to(torch::kFloat32), w.slice(0, offset, offset + rows)),
          tolerance)
          << label;
      const torch::Tensor momentum = *module->optimizer().state()[0].second;
      EXPECT_LE(relative_error(momentum, buf.slice(0, offset, offset + rows)), tolerance) << label;
      // Rows never sampled keep their initial weights and a zero momentum, bit for bit.
      const torch::Tensor untouched =
          touched.slice(0, offset, offset + rows).logical_not().nonzero().squeeze(1);
      if (rate < 1.0 && world() == 1) {
        EXPECT_GT(untouched.numel(), 0) << label;
      }
      const torch::Tensor initial = initial_all.slice(0, offset, offset + rows);
      EXPECT_TRUE(
          torch::equal(module->weight().cpu().to(torch::kFloat32).index_select(0, untouched),
                       initial.index_select(0, untouched)))
          << label;
      EXPECT_EQ(momentum.cpu().index_select(0, untouched).abs().sum().item<double>(), 0.0) << label;
    }
  }
}

// bf16 GEMMs with SGD: on an H100 or H200 the update of bf16 rows is fused with their gradient
// (fused_sgd_rows) by default at this small batch, elsewhere (float32 rows, other GPUs) cuBLAS's
// GEMM and sgd_rows run. Either way
// two steps must match SGD on the float64 reference gradient, the update with the fused kernels
// off, and a rerun bit for bit, for the three row gradients (plain softmax: the rows; ArcFace on
// float32 weights: the normalised copies; on bf16 weights: the stored rows), momentum in float32
// and bf16, Nesterov, chunks, and Partial FC's rows.
TEST_P(ClassifierTest, FusedWeightUpdateMatchesReferenceUnfusedUpdateAndRerun) {
  // 8 rows per rank: a global batch the fused update takes at every rank count.
  const Problem p = make_problem(std::vector<int64_t>(world(), 8), 211, 24, 41);
  struct Case {
    MarginConfig margin;
    torch::ScalarType weight_dtype, state;
    double rate;
    bool nesterov, chunked;
  };
  const MarginConfig arcface = margin_of(MarginType::kArcFace, 1, 0.5, 0);
  const MarginConfig softmax = margin_of(MarginType::kSoftmax, 1, 0, 0);
  const std::vector<Case> cases = {
      {softmax, torch::kFloat32, torch::kFloat32, 1.0, false, false},
      {arcface, torch::kFloat32, torch::kFloat32, 1.0, false, true},
      {arcface, torch::kBFloat16, torch::kBFloat16, 1.0, false, false},
      {arcface, torch::kBFloat16, torch::kFloat32, 0.4, false, true},
      {arcface, torch::kFloat32, torch::kBFloat16, 0.4, true, false},
  };
  for (const Case& c : cases) {
    ShardedSoftmaxOptions o = options_for(p, c.margin);
    o.gemm_dtype = torch::kBFloat16;
    o.update = WeightUpdate::kFused;
    o.weight_dtype = c.weight_dtype;
    o.sample_rate = c.rate;
    o.seed = 9;
    o.optimizer.lr = 0.5;
    o.optimizer.momentum = 0.9;
    o.optimizer.weight_decay = 0.01;
    o.optimizer.nesterov = c.nesterov;
    o.optimizer.state_dtype = c.state;
    // Chunks of 40 classes where the fused update runs (no row gradient, no logits), fewer
    // elsewhere.
    if (c.chunked) {
      o.workspace_bytes = budget_for_chunk(40, p.features.size(0), 24, 2, RowSource::kCopy,
                                           Logits::kInRegisters, RowGradientStore::kNone);
    }
    const std::string label =
        str_format("{}, weights {}, momentum {}, rate {}{}{}", c.margin.describe(),
                   c10::toString(c.weight_dtype), c10::toString(c.state), c.rate,
                   c.nesterov ? ", Nesterov" : "", c.chunked ? ", chunked" : "");
    const auto train = [&](const ShardedSoftmaxOptions& options) {
      auto module = make_module(p, options);
      for (int step = 0; step < 2; ++step) run_step(*module, p);
      return std::make_pair(module->weight().cpu().to(torch::kFloat32),
                            module->optimizer().state()[0].second->cpu().to(torch::kFloat32));
    };
    auto probe = make_module(p, o);
    const bool fused_update =
        probe->kernels().find(str_format("rows' gradient never in memory (global batches of "
                                         "multiples of 8 up to {})",
                                         kFusedUpdateAutoMaxBatch)) != std::string::npos;
    EXPECT_EQ(fused_update,
              hopper_build_on_hopper_gpu(device()) && c.weight_dtype == torch::kBFloat16)
        << label << ": " << probe->kernels();
    const auto [weight, momentum] = train(o);
    const auto [weight_again, momentum_again] = train(o);
    EXPECT_TRUE(torch::equal(weight, weight_again) && torch::equal(momentum, momentum_again))
        << label << ": a rerun differs";
    const ClassPartition& part = probe->partition();
    const int64_t offset = part.offset(rank()), rows = part.size(rank());
    const SgdReference ref = reference_sgd(p, o, 2);
    const torch::Tensor initial =
        p.weight.to(c.weight_dtype).to(torch::kFloat32).slice(0, offset, offset + rows);
    // The updates, not the weights: a wrong update hides among weights that barely move.
    ShardedSoftmaxOptions unfused = o;
    unfused.fused_kernels = FusedKernels::kOff;
    const auto [weight_unfused, momentum_unfused] = train(unfused);
    EXPECT_LE(relative_error(weight - initial, weight_unfused - initial), 3e-2)
        << label << ": update, fused kernels off";
    EXPECT_LE(relative_error(momentum, momentum_unfused), 2e-2) << label << ": momentum, fused off";
    EXPECT_LE(relative_error(weight - initial, ref.weight.slice(0, offset, offset + rows) -
                                                   initial.to(torch::kFloat64)),
              6e-2)
        << label << ": update, float64 reference";
    // bf16 GEMMs put up to 4% into this small problem's momentum on the CPU path (2 steps of
    // ArcFace at s = 64); a wrong term of the update moves it by tens of percent.
    EXPECT_LE(relative_error(momentum, ref.momentum.slice(0, offset, offset + rows)), 6e-2)
        << label << ": momentum, float64 reference";
    if (c.rate < 1.0) {
      // Rows that no step sampled keep their initial weights and a zero momentum.
      const torch::Tensor untouched =
          ref.touched.slice(0, offset, offset + rows).logical_not().nonzero().squeeze(1);
      EXPECT_TRUE(
          torch::equal(weight.index_select(0, untouched), initial.index_select(0, untouched)))
          << label;
      EXPECT_EQ(momentum.index_select(0, untouched).abs().sum().item<double>(), 0.0) << label;
    }
  }
}

// fp16 training scales the loss by a factor that lives on the device: the features' gradient
// carries it, and the fused update undoes it (no host read), for both optimizers. With float16
// GEMMs, the scaler's first 65536 on a batch this small would overflow the logits' gradient.
TEST_P(ClassifierTest, LossScaleOnTheDeviceIsUndoneByTheUpdate) {
  const Problem p = make_problem(uneven_batches(world()), 29, 16, 21);
  for (const auto& [kind, gemm_dtype, tolerance] :
       {std::tuple{OptimizerKind::kSgd, torch::kFloat32, 1e-6},
        std::tuple{OptimizerKind::kAdamW, torch::kFloat32, 1e-6},
        std::tuple{OptimizerKind::kSgd, torch::kFloat16, 2e-3}}) {
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.update = WeightUpdate::kFused;
    o.gemm_dtype = gemm_dtype;
    o.optimizer.kind = kind;
    o.optimizer.lr = 0.1;
    o.optimizer.momentum = 0.9;
    auto plain = make_module(p, o);
    auto scaled = make_module(p, o);
    const torch::Tensor scale = torch::full({1}, 65536.0, torch::device(device()));
    scaled->set_inverse_loss_scale(scale.reciprocal());
    const std::string label = str_format(
        "{}, {} GEMMs", kind == OptimizerKind::kSgd ? "SGD" : "AdamW", c10::toString(gemm_dtype));
    for (int step = 0; step < 2; ++step) {
      const Outcome want = run_step(*plain, p);
      torch::Tensor x = local_rows(p, p.features).to(device()).requires_grad_(true);
      (scaled->forward(x, local_rows(p, p.labels).to(device())) * scale).backward();
      ASSERT_TRUE(scaled->weight().isfinite().all().item<bool>()) << label << ", step " << step;
      EXPECT_LE(relative_error(x.grad().cpu() / 65536.0, want.grad_features), tolerance)
          << label << ", step " << step;
      EXPECT_LE(relative_error(scaled->weight(), plain->weight()), tolerance)
          << label << ", step " << step;
    }
  }
}

// What sgd_rows writes for the next forward as it stores the rows is what that forward would make,
// bit for bit: the rows' 1/|w| where forward reads them (the GEMMs on ArcFace's stored rows, plain
// softmax's bound where it keeps the exponentials), the GEMMs' copy where they read float32 rows in
// bfloat16 and the plan caches. A module made to make them afresh each step (an in-place write of
// the same values moves the weight's version) steps as one that takes them from the update, and a
// forward under no_grad (which caches no plan) takes them alike. At D = 64 the row kernels read
// packs of 4, at D = 6 single elements; in chunks, each chunk's update writes its own rows' norms,
// and no copy is kept. The copy's cases run in a workspace that just fits the rows, so that each
// chunk's gradient comes in several pieces (row_gradient_piece_rows). On the CPU both modules make
// their own.
TEST_P(ClassifierTest, WhatTheUpdateWritesIsWhatForwardWouldMake) {
  struct Case {
    int64_t dim;
    bool chunked;
    torch::ScalarType weight, gemm;
    MarginType margin = MarginType::kArcFace;
  };
  const torch::ScalarType f32 = torch::kFloat32, bf16 = torch::kBFloat16;
  for (const Case c :
       {Case{64, false, bf16, bf16}, Case{6, false, bf16, bf16}, Case{64, true, bf16, bf16},
        Case{64, false, f32, f32}, Case{6, true, f32, f32}, Case{64, false, f32, bf16},
        Case{6, false, f32, bf16}, Case{64, true, f32, bf16},
        Case{64, false, f32, bf16, MarginType::kSoftmax}}) {
    const std::string what = str_format(
        "{} rows, {} GEMMs, D = {}{}{}", c10::toString(c.weight), c10::toString(c.gemm), c.dim,
        c.chunked ? ", in chunks" : "", c.margin == MarginType::kSoftmax ? ", plain softmax" : "");
    const Problem p = make_problem(uneven_batches(world()), 301, c.dim, 37);
    const bool normalized = c.margin != MarginType::kSoftmax;
    ShardedSoftmaxOptions o =
        options_for(p, normalized ? margin_of(c.margin, 1, 0.5, 0) : margin_of(c.margin, 1, 0, 0));
    o.update = WeightUpdate::kFused;
    o.fused_update = FusedUpdate::kOff;
    o.weight_dtype = c.weight;
    o.gemm_dtype = c.gemm;
    o.optimizer.lr = 0.1;
    o.optimizer.momentum = 0.9;
    const int64_t gemm_bytes = static_cast<int64_t>(torch::elementSize(c.gemm));
    const RowSource source = row_source(c.weight, c.gemm, false);
    const RowGradientStore store = row_gradient_store(c.weight, c.gemm, true);
    const int64_t batch = p.features.size(0);
    if (c.chunked) {
      o.workspace_bytes =
          budget_for_chunk(16, batch, c.dim, gemm_bytes, source, Logits::kInMemory, store);
    } else if (source == RowSource::kCopy) {
      o.workspace_bytes =
          budget_for_chunk(301, batch, c.dim, gemm_bytes, source, Logits::kInMemory, store);
    }
    auto taken = make_module(p, o), measured = make_module(p, o);
    const bool copies = source == RowSource::kCopy && !c.chunked;
    if (copies) {
      ASSERT_LT(row_gradient_piece_rows(o.workspace_bytes, c.dim, store), taken->weight().size(0))
          << what << ": the update in pieces";
    }
    // The start-up line names what the update writes.
    if (device().is_cuda()) {
      const char* const says = source == RowSource::kStored
                                   ? "writes the rows' 1/|w|"
                                   : "copy of the rows where a plan caches";
      EXPECT_NE(taken->kernels().find(says), std::string::npos) << taken->kernels();
    }
    const torch::Tensor x = local_rows(p, p.features).to(device());
    const torch::Tensor y = local_rows(p, p.labels).to(device());
    for (int step = 0; step < 3; ++step) {
      const std::string at = str_format("{}, step {}", what, step);
      measured->weight().mul_(1);
      EXPECT_FALSE(measured->norms_from_update() || measured->copy_from_update()) << what;
      const Outcome a = run_step(*taken, p), b = run_step(*measured, p);
      EXPECT_TRUE(torch::equal(a.loss, b.loss)) << at;
      EXPECT_TRUE(torch::equal(a.grad_features, b.grad_features)) << at;
      EXPECT_TRUE(torch::equal(taken->weight().cpu(), measured->weight().cpu())) << at;
      const bool kept = taken->last_plan().kept_exponentials;
      EXPECT_EQ(taken->norms_from_update(),
                device().is_cuda() && (normalized ? source == RowSource::kStored : kept))
          << at;
      EXPECT_EQ(taken->copy_from_update(), device().is_cuda() && copies) << at;
      EXPECT_EQ(taken->last_plan().cache, !c.chunked) << at;
      if (c.chunked) {
        EXPECT_GT(taken->last_plan().chunks, 1) << at;
      }
      measured->weight().mul_(1);
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(taken->forward(x, y).cpu(), measured->forward(x, y).cpu())) << at;
    }
  }
}

// A step that takes the fused update writes the rows without their norms, so it must void those
// that an earlier step's sgd_rows wrote: the step after it measures the rows again. Global batches
// of 3W + 1 samples take sgd_rows (not a multiple of 8), of 8W the fused update, where it runs
// (bf16 rows on an H100 or H200); a module that measures the norms every step is the reference,
// bit for bit. Elsewhere every step takes the row kernels, and the test checks that they agree.
TEST_P(ClassifierTest, FusedUpdateVoidsTheNormsOfAnEarlierStep) {
  std::vector<int64_t> odd(static_cast<size_t>(world()), 3),
      eights(static_cast<size_t>(world()), 8);
  odd[0] += 1;
  const Problem a = make_problem(odd, 301, 64, 41);
  Problem b = make_problem(eights, 301, 64, 43);
  b.weight = a.weight;
  ShardedSoftmaxOptions o = options_for(a, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  o.update = WeightUpdate::kFused;
  o.weight_dtype = o.gemm_dtype = torch::kBFloat16;
  o.optimizer.lr = 0.5;
  o.optimizer.momentum = 0.9;
  auto taken = make_module(a, o), measured = make_module(a, o);
  const bool fused_update =
      taken->kernels().find("never in memory (global batches") != std::string::npos;
  EXPECT_EQ(fused_update, hopper_build_on_hopper_gpu(device())) << taken->kernels();
  const Problem* steps[] = {&a, &b, &a, &b, &a};
  for (size_t step = 0; step < std::size(steps); ++step) {
    measured->weight().mul_(1);
    const Outcome want = run_step(*measured, *steps[step]), got = run_step(*taken, *steps[step]);
    EXPECT_TRUE(torch::equal(got.loss, want.loss)) << "step " << step;
    EXPECT_TRUE(torch::equal(got.grad_features, want.grad_features)) << "step " << step;
    EXPECT_TRUE(torch::equal(taken->weight().cpu(), measured->weight().cpu())) << "step " << step;
    // After sgd_rows on the GPU the norms come from the update; after the fused update, never.
    const bool rows_kernels = steps[step] == &a || !fused_update;
    EXPECT_EQ(taken->norms_from_update(), device().is_cuda() && rows_kernels) << "step " << step;
  }
}

// Float32 rows, and bf16 rows under bf16 GEMMs, whose gradient reaches adamw_rows in bf16: at
// D = 8 the row kernels read packs of 4, at D = 6 single elements (rows of 12 bytes). The bf16
// bound holds the rows' rounding, 2^-8 of a weight each step (3-6e-3 of the shard), and the odd
// element whose tiny gradient the bf16 logits (at s = 64) turn over, which AdamW's first step
// makes a whole step the other way: one in a shard of 60 elements (3 ranks) costs 0.03. A
// gradient read wrongly or not at all errs by the steps, lr = 0.01 on weights of about 0.1:
// 0.1 for one step of the three, 0.2 and more for all.
TEST_P(ClassifierTest, FusedAdamWMatchesReference) {
  for (const auto& [dtype, dim, tolerance] :
       {std::tuple{torch::kFloat32, 8, 1e-4}, std::tuple{torch::kBFloat16, 8, 6e-2},
        std::tuple{torch::kBFloat16, 6, 6e-2}}) {
    const Problem p = make_problem(uneven_batches(world()), 31, dim, 17);
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.update = WeightUpdate::kFused;
    o.optimizer.kind = OptimizerKind::kAdamW;
    o.optimizer.lr = 0.01;
    o.optimizer.weight_decay = 0.05;
    o.weight_dtype = o.gemm_dtype = dtype;
    auto module = make_module(p, o);
    const ClassPartition& part = module->partition();
    torch::Tensor w = p.weight.to(dtype).to(torch::kFloat64);
    torch::Tensor m = torch::zeros_like(w), v = torch::zeros_like(w);
    for (int step = 1; step <= 3; ++step) {
      run_step(*module, p);
      const torch::Tensor g =
          reference_softmax(p.features, p.labels, w.to(torch::kFloat32), o.margin).grad_weight;
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
      w = w * (1 - 0.01 * 0.05) - (0.01 / bc1) * m / ((v / bc2).sqrt() + 1e-8);
    }
    const double error =
        relative_error(module->weight().to(torch::kFloat64),
                       w.slice(0, part.offset(rank()), part.offset(rank()) + part.size(rank())));
    EXPECT_LE(error, tolerance) << c10::toString(dtype) << " rows, D = " << dim;
  }
}

// The gradient-scale trap of design §1: a replicated backbone trained on W ranks, its gradients
// SUMMED across ranks, must equal one process training on the union of the batches.
TEST_P(ClassifierTest, BackboneGradientSummedOverRanksEqualsSingleProcess) {
  const std::vector<int64_t> counts = uneven_batches(world());
  const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  torch::manual_seed(21);
  const torch::Tensor inputs = torch::randn({n, 12});
  const torch::Tensor labels = torch::randint(0, 29, {n}, torch::kInt64);
  const torch::Tensor backbone_weight = torch::randn({16, 12}) * 0.3;
  const torch::Tensor class_weight = torch::randn({29, 16}) * 0.1;
  const MarginConfig margin = margin_of(MarginType::kArcFace, 1, 0.5, 0);

  Problem p{torch::Tensor(), labels, class_weight, counts};
  ShardedSoftmaxOptions o = options_for(p, margin);
  auto module = make_module(p, o);
  torch::Tensor backbone = backbone_weight.to(device()).clone().requires_grad_(true);
  const torch::Tensor features = torch::mm(local_rows(p, inputs).to(device()), backbone.t());
  module->forward(features, local_rows(p, labels).to(device())).backward();
  torch::Tensor grad = backbone.grad().clone();
  comm().all_reduce(grad, ReduceOp::kSum);

  torch::Tensor ref_backbone = backbone_weight.to(torch::kFloat64).detach().requires_grad_(true);
  const ReferenceResult ref =
      reference_softmax(torch::mm(inputs.to(torch::kFloat64), ref_backbone.t()).detach(), labels,
                        class_weight, margin);
  torch::mm(inputs.to(torch::kFloat64), ref_backbone.t()).backward(ref.grad_features);
  EXPECT_LE(relative_error(grad, ref_backbone.grad()), kTolerance);
  if (world() > 1) {
    // Averaging instead of summing would be off by exactly the world size.
    EXPECT_GT(relative_error(grad / world(), ref_backbone.grad()), 0.4);
  }
}

TEST_P(ClassifierTest, ExtremeCosinesAndLogitsStayFinite) {
  const int64_t classes = 2 * world() + 3, dim = 8;
  std::vector<int64_t> counts(world(), 4);
  Problem p = make_problem(counts, classes, dim, 18);
  const int64_t n = p.features.size(0);
  // Features exactly on their class weight (cos = 1, theta = 0), exactly opposite it
  // (cos = -1, theta + m2 > pi), and huge raw logits for plain softmax.
  for (int64_t i = 0; i < n; ++i) {
    const torch::Tensor w = p.weight[p.labels[i].item<int64_t>()];
    p.features[i].copy_(i % 2 == 0 ? w * 3.0 : w * -2.0);
  }
  for (const MarginConfig& margin :
       {margin_of(MarginType::kArcFace, 1, 0.5, 0), margin_of(MarginType::kSphereFace, 4.0, 0, 0),
        margin_of(MarginType::kCombined, 1.35, 0.5, 0.2)}) {
    auto module = make_module(p, options_for(p, margin));
    const Outcome out = run_step(*module, p);
    EXPECT_TRUE(std::isfinite(out.loss.item<float>())) << margin.describe();
    EXPECT_TRUE(out.grad_features.isfinite().all().item<bool>()) << margin.describe();
    EXPECT_TRUE(module->weight_grad().isfinite().all().item<bool>()) << margin.describe();
  }
  Problem huge = p;
  huge.features = p.features * 1e4;
  auto module = make_module(huge, options_for(huge, margin_of(MarginType::kSoftmax, 1, 0, 0)));
  const Outcome out = run_step(*module, huge);
  EXPECT_TRUE(std::isfinite(out.loss.item<float>()));
  EXPECT_TRUE(out.grad_features.isfinite().all().item<bool>());
}

TEST_P(ClassifierTest, PredictIsTheGlobalArgmax) {
  const Problem p = make_problem(uneven_batches(world()), 43, 16, 19);
  ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  o.workspace_bytes = budget_for_chunk(4, p.features.size(0), 16);
  auto module = make_module(p, o);
  const torch::Tensor predicted = module->predict(local_rows(p, p.features).to(device())).cpu();
  const torch::Tensor cosine =
      torch::nn::functional::normalize(p.features.to(torch::kFloat64),
                                       torch::nn::functional::NormalizeFuncOptions().dim(1))
          .matmul(
              torch::nn::functional::normalize(p.weight.to(torch::kFloat64),
                                               torch::nn::functional::NormalizeFuncOptions().dim(1))
                  .t());
  EXPECT_TRUE(torch::equal(predicted, local_rows(p, cosine.argmax(1))));
}

// Bad inputs raise the same collective error on every rank, whichever rank holds them.
TEST_P(ClassifierTest, BadInputsFailOnEveryRank) {
  const Problem p = make_problem(uneven_batches(world()), 19, 8, 20);
  auto module = make_module(p, options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0)));
  const int culprit = world() - 1;
  auto expect_error = [&](const torch::Tensor& features, const torch::Tensor& labels,
                          const std::string& expected) {
    try {
      module->forward(features.to(device()).requires_grad_(true), labels.to(device()));
      ADD_FAILURE() << "no error; expected one mentioning: " << expected;
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective()) << e.what();
      EXPECT_NE(e.message().find(expected), std::string::npos) << e.message();
    }
  };
  torch::Tensor labels = local_rows(p, p.labels).clone();
  torch::Tensor features = local_rows(p, p.features).clone();
  {
    torch::Tensor bad = labels.clone();
    if (rank() == culprit) bad[0] = 19;
    expect_error(features, bad, str_format("label 19 of sample 0 of rank {}", culprit));
  }
  {
    torch::Tensor bad = labels.clone();
    if (rank() == culprit) bad[1] = -3;
    expect_error(features, bad, "label -3");
  }
  {
    torch::Tensor bad = features.clone();
    if (rank() == culprit) bad[2][1] = std::numeric_limits<float>::quiet_NaN();
    expect_error(bad, labels, str_format("features of sample 2 of rank {} contain NaN", culprit));
  }
  expect_error(torch::randn({labels.size(0), 9}), labels, "expects [batch, 8]");
  if (world() > 1) {
    // One rank's features of the wrong width: caught by the gather's agreement.
    expect_error(torch::randn({labels.size(0), rank() == culprit ? 9 : 8}), labels,
                 "shapes differ");
  }
  try {
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.num_classes = world() - 1;
    ShardedMarginSoftmax too_few(comm(), o, device());
    ADD_FAILURE() << "fewer classes than ranks was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
  }
  // Fused kernels required: built where they apply (an H100 or H200 with bf16 GEMMs), refused on
  // every rank elsewhere; float32 GEMMs never take them.
  for (torch::ScalarType gemm_dtype : {torch::kBFloat16, torch::kFloat32}) {
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.gemm_dtype = gemm_dtype;
    o.fused_kernels = FusedKernels::kRequired;
    const bool applies = gemm_dtype == torch::kBFloat16 && hopper_build_on_hopper_gpu(device());
    try {
      ShardedMarginSoftmax required(comm(), o, device());
      EXPECT_TRUE(applies && required.fused()) << c10::toString(gemm_dtype) << " GEMMs accepted";
    } catch (const Error& e) {
      EXPECT_FALSE(applies) << e.what();
      EXPECT_TRUE(e.collective());
      EXPECT_NE(e.message().find("the fused classifier kernels need an H100 or H200 GPU"),
                std::string::npos)
          << e.message();
    }
  }
  // The fused update asked for: built where it applies (bf16 rows, SGD, on an H100 or H200 with
  // bf16 GEMMs), refused on every rank elsewhere.
  for (const auto& [weight_dtype, kind] : {std::pair{torch::kBFloat16, OptimizerKind::kSgd},
                                           std::pair{torch::kFloat32, OptimizerKind::kSgd},
                                           std::pair{torch::kBFloat16, OptimizerKind::kAdamW}}) {
    ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
    o.gemm_dtype = torch::kBFloat16;
    o.update = WeightUpdate::kFused;
    o.weight_dtype = weight_dtype;
    o.optimizer.kind = kind;
    o.fused_update = FusedUpdate::kOn;
    const bool applies = weight_dtype == torch::kBFloat16 && kind == OptimizerKind::kSgd &&
                         hopper_build_on_hopper_gpu(device());
    const std::string label = str_format("{} weights, {}", c10::toString(weight_dtype),
                                         kind == OptimizerKind::kSgd ? "SGD" : "AdamW");
    try {
      ShardedMarginSoftmax required(comm(), o, device());
      EXPECT_TRUE(applies) << label << ": accepted";
      // On: every batch the kernel takes, not only those up to kFusedUpdateAutoMaxBatch.
      EXPECT_NE(required.kernels().find("rows' gradient never in memory (global batches of "
                                        "multiples of 8)"),
                std::string::npos)
          << label << ": " << required.kernels();
    } catch (const Error& e) {
      EXPECT_FALSE(applies) << label << ": " << e.what();
      EXPECT_TRUE(e.collective());
      EXPECT_NE(e.message().find("the fused weight update needs the fused classifier kernels, SGD "
                                 "and bfloat16 weights"),
                std::string::npos)
          << e.message();
    }
  }
  // The module still works after the errors.
  const Outcome out = run_step(*module, p);
  EXPECT_TRUE(std::isfinite(out.loss.item<float>()));
}

TEST_P(ClassifierTest, SkipPolicyTurnsNonFiniteFeaturesIntoASkippedStep) {
  const Problem p = make_problem(uneven_batches(world()), 19, 8, 22);
  ShardedSoftmaxOptions o = options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0));
  o.non_finite = NonFinitePolicy::kSkip;
  o.update = WeightUpdate::kFused;
  auto module = make_module(p, o);
  const torch::Tensor before = module->weight().clone();
  torch::Tensor features = local_rows(p, p.features).clone();
  if (rank() == 0) features[0][0] = std::numeric_limits<float>::infinity();
  torch::Tensor x = features.to(device()).requires_grad_(true);
  torch::Tensor loss = module->forward(x, local_rows(p, p.labels).to(device()));
  loss.backward();
  EXPECT_TRUE(std::isnan(loss.item<float>()));
  EXPECT_EQ(x.grad().abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(module->weight(), before));
}

// A step in parts (1F1B's micro-batches: each rank's rows cut into three, some of them empty) gives
// the step whole: the loss (the parts' sum), the features' gradient, and the rows' gradient or,
// over two steps, their fused update. Chunked and cached plans, Partial FC (the same classes
// sampled for every part), GEMMs on stored bfloat16 rows, SGD and AdamW.
TEST_P(ClassifierTest, PartsOfAStepGiveTheWholeStep) {
  const Problem p = make_problem(uneven_batches(world()), 37, 16, 44);
  const int64_t batch = p.features.size(0);
  struct Case {
    std::string label;
    ShardedSoftmaxOptions o;
    double tolerance;
  };
  std::vector<Case> cases;
  const auto add = [&](const std::string& label, const MarginConfig& margin, double tolerance,
                       const auto& adjust) {
    Case c{label, options_for(p, margin), tolerance};
    adjust(c.o);
    cases.push_back(c);
  };
  const auto nothing = [](ShardedSoftmaxOptions&) {};
  add("ArcFace, gradients, cached", margin_of(MarginType::kArcFace, 1, 0.5, 0), kTolerance,
      nothing);
  add("CosFace, gradients, chunks of 5 classes", margin_of(MarginType::kCosFace, 1, 0, 0.4),
      kTolerance,
      [&](ShardedSoftmaxOptions& o) { o.workspace_bytes = budget_for_chunk(5, batch, 16); });
  add("softmax, gradients, Partial FC", margin_of(MarginType::kSoftmax, 1, 0, 0), kTolerance,
      [](ShardedSoftmaxOptions& o) { o.sample_rate = 0.4; });
  // ArcFace amplifies the float32 rounding of the rows that step 0 wrote: its second step's
  // features' gradient differs by up to 1.3e-5 between the parts and the whole at 4 ranks.
  add("ArcFace, fused SGD, chunks of 4 classes", margin_of(MarginType::kArcFace, 1, 0.5, 0),
      4 * kTolerance, [&](ShardedSoftmaxOptions& o) {
        o.update = WeightUpdate::kFused;
        o.optimizer.lr = 0.1;
        o.optimizer.momentum = 0.9;
        o.workspace_bytes = budget_for_chunk(4, batch, 16);
      });
  add("ArcFace, fused SGD, Partial FC", margin_of(MarginType::kArcFace, 1, 0.5, 0), kTolerance,
      [](ShardedSoftmaxOptions& o) {
        o.update = WeightUpdate::kFused;
        o.optimizer.lr = 0.1;
        o.optimizer.momentum = 0.9;
        o.sample_rate = 0.5;
      });
  add("combined, fused AdamW, Partial FC", margin_of(MarginType::kCombined, 1.2, 0.3, 0.15),
      kTolerance, [](ShardedSoftmaxOptions& o) {
        o.update = WeightUpdate::kFused;
        o.optimizer.kind = OptimizerKind::kAdamW;
        o.optimizer.lr = 0.01;
        o.sample_rate = 0.5;
      });
  // The same bfloat16 products either way, chunked (parts recompute the logits, and so does a
  // whole step in chunks); float32 sums over batches of other shapes.
  const auto bf16_rows = [&](ShardedSoftmaxOptions& o) {
    o.update = WeightUpdate::kFused;
    o.optimizer.lr = 0.1;
    o.gemm_dtype = torch::kBFloat16;
    o.weight_dtype = torch::kBFloat16;
  };
  add("ArcFace, fused SGD, bf16 rows read by the GEMMs, chunks",
      margin_of(MarginType::kArcFace, 1, 0.5, 0), 1e-3, [&](ShardedSoftmaxOptions& o) {
        bf16_rows(o);
        o.workspace_bytes = budget_for_chunk(8, batch, 16, 2, RowSource::kStored,
                                             Logits::kInRegisters, RowGradientStore::kNone);
      });
  // Whole, the fused kernels keep the exponentials: the logits' gradient rounded to bf16 from
  // another product, so within bf16's tolerance of the parts' recomputation.
  add("ArcFace, fused SGD, bf16 rows read by the GEMMs, whole",
      margin_of(MarginType::kArcFace, 1, 0.5, 0), 1e-2, bf16_rows);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    auto whole = make_module(p, c.o);
    auto parted = make_module(p, c.o);
    const torch::Tensor x = local_rows(p, p.features).to(device());
    const torch::Tensor y = local_rows(p, p.labels).to(device());
    const int steps = c.o.update == WeightUpdate::kFused ? 2 : 1;
    for (int step = 0; step < steps; ++step) {
      const Outcome want = run_step(*whole, p);
      const std::vector<torch::Tensor> cut = torch::tensor_split(torch::arange(x.size(0)), 3);
      std::vector<int64_t> part_rows;
      for (const torch::Tensor& rows : cut) part_rows.push_back(rows.numel());
      parted->begin_parts(y, part_rows);
      torch::Tensor loss = torch::zeros({}, torch::device(device()));
      std::vector<torch::Tensor> grads;
      for (const torch::Tensor& rows : cut) {
        const int64_t first = rows.numel() > 0 ? rows[0].item<int64_t>() : 0;
        torch::Tensor part = x.narrow(0, first, rows.numel()).clone().requires_grad_(true);
        const torch::Tensor part_loss = parted->forward(part, y.narrow(0, first, rows.numel()));
        part_loss.backward();
        loss = loss + part_loss.detach();
        grads.push_back(part.grad().cpu());
      }
      parted->finish_parts();
      EXPECT_LE(relative_error(loss, want.loss), c.tolerance) << "loss, step " << step;
      expect_same_loss_everywhere(loss.cpu());
      EXPECT_LE(relative_error(torch::cat(grads), want.grad_features), c.tolerance)
          << "features' gradient, step " << step;
      if (c.o.update == WeightUpdate::kFused) {
        EXPECT_LE(relative_error(parted->weight(), whole->weight()), c.tolerance)
            << "rows, step " << step;
        // The next step starts both from the whole step's rows and state. Updates that differ at
        // bf16's resolution round stochastically to rows a whole ulp apart here and there, and
        // from such rows ArcFace's next loss may differ by more than any bound on the parts.
        parted->weight().copy_(whole->weight());
        const auto from = whole->optimizer().state();
        const auto to = parted->optimizer().state();
        for (size_t i = 0; i < from.size(); ++i) to[i].second->copy_(*from[i].second);
      } else {
        EXPECT_LE(relative_error(parted->weight_grad(), whole->weight_grad()), c.tolerance)
            << "rows' gradient";
      }
    }
  }
}

// Parts whose rows the ranks disagree on fail on every rank at begin_parts, naming the rank, and a
// part whose features or labels are not what begin_parts agreed is refused before its first
// collective (which no longer agrees on its arguments across ranks); the module trains after all.
TEST_P(ClassifierTest, PartsThatDisagreeFailOnEveryRank) {
  const Problem p = make_problem(uneven_batches(world()), 19, 8, 46);
  auto module = make_module(p, options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0)));
  const int culprit = world() - 1;
  const torch::Tensor x = local_rows(p, p.features).to(device());
  const torch::Tensor y = local_rows(p, p.labels).to(device());
  const int64_t rows = y.size(0);
  const std::vector<int64_t> halves = {rows / 2, rows - rows / 2};
  const auto expect_error = [](const std::function<void()>& call, const std::string& expected,
                               bool collective) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning: " << expected;
    } catch (const Error& e) {
      EXPECT_EQ(e.collective(), collective) << e.what();
      EXPECT_NE(e.message().find(expected), std::string::npos) << e.message();
    }
  };
  if (world() > 1) {
    expect_error(
        [&] { module->begin_parts(y, rank() == culprit ? std::vector<int64_t>{rows} : halves); },
        str_format("rank {} cuts the step into 1 parts, rank 0 into 2", culprit), true);
  }
  expect_error(
      [&] {
        module->begin_parts(y, rank() == culprit ? std::vector<int64_t>{rows, 1} : halves);
      },
      str_format("rank {}'s rows of its parts do not sum to its", culprit), true);
  expect_error([&] { module->begin_parts(y, {}); }, "a step in no parts", true);

  module->begin_parts(y, halves);
  const auto part = [&](int64_t first, int64_t count, int64_t width, torch::ScalarType labels) {
    torch::Tensor features =
        width == 8 ? x.narrow(0, first, count).clone() : torch::randn({count, width}).to(device());
    torch::Tensor loss =
        module->forward(features.requires_grad_(true), y.narrow(0, first, count).to(labels));
    loss.backward();
    return loss.detach();
  };
  expect_error([&] { part(0, halves[0], 9, torch::kInt64); },
               str_format("part 0: this rank's features must be float32 [{}, 8]", halves[0]),
               false);
  expect_error([&] { part(0, halves[0], 8, torch::kInt32); },
               str_format("part 0: this rank's labels must be int64 [{}]", halves[0]), false);
  // The parts in order: the operands of + may be evaluated in either.
  const torch::Tensor first = part(0, halves[0], 8, torch::kInt64);
  const torch::Tensor loss = first + part(halves[0], halves[1], 8, torch::kInt64);
  expect_error([&] { part(0, halves[0], 8, torch::kInt64); },
               "a forward beyond the 2 parts that begin_parts agreed on", false);
  module->finish_parts();
  // The same step whole, on a module that saw no errors: the same loss.
  auto whole = make_module(p, options_for(p, margin_of(MarginType::kArcFace, 1, 0.5, 0)));
  EXPECT_LE(relative_error(loss, run_step(*whole, p).loss), kTolerance);
  // And it still trains.
  EXPECT_TRUE(std::isfinite(run_step(*module, p).loss.item<float>()));
}

INSTANTIATE_TEST_SUITE_P(Backends, ClassifierTest, ::testing::Values("mpi", "nccl"), backend_name);

}  // namespace
}  // namespace myriad::testing
