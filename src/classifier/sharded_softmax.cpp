#include "myriad/classifier/sharded_softmax.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "myriad/classifier/mixed_gemm.h"
#include "myriad/classifier/partial_fc.h"
#include "myriad/comm/communicator.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"
#include "myriad/util/host_copy.h"
#include "myriad/util/phase_timer.h"
#include "softmax_chunk.h"

namespace myriad {

namespace {

constexpr int64_t kNoTarget = -1;

// Where global sample `index` came from, for error messages.
std::string sample_origin(int64_t index, const std::vector<int64_t>& counts) {
  for (size_t r = 0; r < counts.size(); ++r) {
    if (index < counts[r]) return str_format("sample {} of rank {}", index, r);
    index -= counts[r];
  }
  return "an unknown sample";
}

int64_t first_true(const torch::Tensor& mask) {
  return mask.nonzero().select(1, 0)[0].item<int64_t>();
}

// Normal(0, std) rows [begin, begin + rows) of a [*, dim] matrix in `dtype`, element (i, j) drawn
// from (seed, i * dim + j), in blocks that bound the temporary memory.
torch::Tensor hashed_normal_rows(int64_t begin, int64_t rows, int64_t dim, double std,
                                 uint64_t seed, torch::ScalarType dtype,
                                 const torch::Device& device) {
  torch::Tensor out = torch::empty({rows, dim}, torch::dtype(dtype).device(device));
  const int64_t rows_per_block =
      std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(dim, 1));
  for (int64_t r = 0; r < rows; r += rows_per_block) {
    const int64_t n = std::min(rows_per_block, rows - r);
    const torch::Tensor keys = torch::arange((begin + r) * dim, (begin + r + n) * dim,
                                             torch::dtype(torch::kInt64).device(device));
    out.slice(0, r, r + n).copy_(hash_normal(keys, seed).mul_(std).view({n, dim}));
  }
  return out;
}

}  // namespace

// Everything forward computed that backward needs.
struct ShardedMarginSoftmax::Step {
  int64_t id = 0;
  std::vector<int64_t> counts;
  int64_t batch = 0;
  int64_t divisor = 0;  // the loss is the mean over this many samples: the whole step's
  int64_t local_begin = 0;
  torch::ScalarType feature_dtype = torch::kFloat32;
  bool backward = true;  // false: no backward follows, so the plan caches nothing for one
  bool skip = false;
  torch::Tensor xn;          // [B, D] float32: normalised features (raw for softmax)
  torch::Tensor inv_xnorm;   // [B, 1] when normalised
  torch::Tensor xg;          // xn as GEMM operand
  torch::Tensor target_col;  // [B] row among the active rows, or kNoTarget
  torch::Tensor active;      // Partial FC's shard rows; undefined when all rows are active
  int64_t active_rows = 0;
  ChunkPlan plan;
  // The GEMMs read the stored rows themselves (see chunk_rows), and row_scales[c] holds chunk
  // c's 1/|w| when the margin normalises.
  bool stored_rows = false;
  std::vector<torch::Tensor> row_scales;
  torch::Tensor row_max;      // [B] global max logit
  torch::Tensor row_inv_sum;  // [B] 1 / global sum of exp(z - max)
  std::vector<torch::Tensor> cached_dot;
  std::vector<torch::Tensor> cached_rows;
  KeptExponentials kept;      // where the plan keeps the exponentials
  torch::Tensor finite_rows;  // [B] bool, a part's: whether each sample's features are finite
};

// A step whose batch comes in parts: what begin_parts fixed, and each part once its backward ran.
struct ShardedMarginSoftmax::Parts {
  std::vector<int64_t> counts;                    // every rank's labels of the whole step
  std::vector<std::vector<int64_t>> part_counts;  // every rank's rows of each part
  size_t forwarded = 0;                           // parts forwarded so far
  int64_t batch = 0;                              // the whole step's global batch
  torch::Tensor active;                           // Partial FC's rows for every part
  torch::Tensor upstream;                         // the incoming gradient of the parts' backward
  std::vector<std::unique_ptr<Step>> done;
};

namespace {

class ShardedSoftmaxFunction : public torch::autograd::Function<ShardedSoftmaxFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& features,
                               const torch::Tensor& labels, ShardedMarginSoftmax* module) {
    int64_t step = 0;
    torch::Tensor loss = module->run_forward(features, labels, &step);
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    ctx->saved_data["step"] = step;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* module = reinterpret_cast<ShardedMarginSoftmax*>(ctx->saved_data["module"].toInt());
    return {module->run_backward(ctx->saved_data["step"].toInt(), grads[0]), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor initial_shard(int64_t first, int64_t rows, const ShardedSoftmaxOptions& options,
                            const torch::Device& device) {
  return hashed_normal_rows(first, rows, options.embedding_size, options.init_std, options.seed,
                            options.weight_dtype, device);
}

ShardedMarginSoftmax::ShardedMarginSoftmax(Communicator& comm, const ShardedSoftmaxOptions& options,
                                           const torch::Device& device)
    : comm_(comm),
      options_(options),
      device_(device),
      partition_(options.num_classes, comm.size()) {
  MYRIAD_CHECK_COLLECTIVE(options.embedding_size > 0, "the embedding size must be positive, got {}",
                          options.embedding_size);
  MYRIAD_CHECK_COLLECTIVE(options.sample_rate > 0.0 && options.sample_rate <= 1.0,
                          "the sample rate must be in (0, 1], got {}", options.sample_rate);
  MYRIAD_CHECK_COLLECTIVE(options.gemm_dtype == torch::kFloat32 ||
                              options.gemm_dtype == torch::kBFloat16 ||
                              options.gemm_dtype == torch::kFloat16,
                          "classifier GEMMs run in float32, bfloat16 or float16");
  MYRIAD_CHECK_COLLECTIVE(options.workspace_bytes > 0, "the classifier workspace must be positive");
  MYRIAD_CHECK_COLLECTIVE(
      options.weight_dtype == torch::kFloat32 || options.weight_dtype == torch::kBFloat16,
      "classifier weights are stored in float32 or bfloat16");
  fused_ = options.fused_kernels != FusedKernels::kOff &&
           fused_chunks_apply(device, options.embedding_size, options.gemm_dtype);
  MYRIAD_CHECK_COLLECTIVE(fused_ || options.fused_kernels != FusedKernels::kRequired,
                          "the fused classifier kernels need an H100 or H200 GPU, bf16 GEMMs and "
                          "an embedding size that is a multiple of 8 up to 512 (this run: {}, {} "
                          "GEMMs, embedding size {})",
                          kernels(), c10::toString(options.gemm_dtype), options.embedding_size);
  fused_update_ = fused_ && options.update == WeightUpdate::kFused &&
                  options.fused_update != FusedUpdate::kOff &&
                  ShardOptimizer::updates_from_logit_grad(
                      options.optimizer.kind, 8, options.embedding_size, options.weight_dtype);
  MYRIAD_CHECK_COLLECTIVE(
      fused_update_ || options.fused_update != FusedUpdate::kOn,
      "the fused weight update needs the fused classifier kernels, SGD and bfloat16 weights that "
      "the classifier updates (this run: {}, {}, {} weights)",
      kernels(), options.optimizer.kind == OptimizerKind::kSgd ? "SGD" : "AdamW",
      c10::toString(options.weight_dtype));
  const int64_t rows = partition_.size(comm.rank());
  const int64_t first = partition_.offset(comm.rank());
  weight_ = initial_shard(first, rows, options, device);
  if (options.update == WeightUpdate::kAccumulateGrad) {
    weight_grad_ = torch::zeros(weight_.sizes(), weight_.options().dtype(torch::kFloat32));
  }
  optimizer_ = std::make_unique<ShardOptimizer>(options.optimizer, rows, options.embedding_size,
                                                device, first, options.seed);
}

std::string ShardedMarginSoftmax::kernels() const {
  if (fused_update_)
    return str_format(
        "fused Hopper kernels, logits never in memory, SGD's rows' gradient never in memory "
        "(global batches of multiples of 8{})",
        options_.fused_update == FusedUpdate::kAuto
            ? str_format(" up to {}", kFusedUpdateAutoMaxBatch)
            : std::string());
  if (fused_) return "fused Hopper kernels, logits never in memory";
  return device_.is_cuda() ? "GEMMs and softmax kernels" : "LibTorch on the CPU";
}

ShardedMarginSoftmax::~ShardedMarginSoftmax() = default;

torch::Tensor ShardedMarginSoftmax::chunk_rows(const Step& step, int64_t begin, int64_t end) {
  if (step.stored_rows) return weight_.slice(0, begin, end);
  return prepare_chunk_rows(weight_, step.active, begin, end, options_.gemm_dtype,
                            options_.margin.params().normalized);
}

void ShardedMarginSoftmax::phase(const char* name) {
  if (timer_ != nullptr) timer_->mark(std::string("classifier.") + name);
}

void ShardedMarginSoftmax::zero_grad() {
  if (weight_grad_.defined()) weight_grad_.zero_();
}

torch::Tensor ShardedMarginSoftmax::forward(const torch::Tensor& features,
                                            const torch::Tensor& labels) {
  if (torch::GradMode::is_enabled() && features.requires_grad()) {
    return ShardedSoftmaxFunction::apply(features, labels, this);
  }
  // Nothing will call backward: keep no state for it.
  torch::NoGradGuard no_grad;
  int64_t step = 0;
  torch::Tensor loss = run_forward(features, labels, &step, /*backward=*/false);
  pending_.reset();
  return loss;
}

torch::Tensor ShardedMarginSoftmax::local_targets(const torch::Tensor& y) const {
  const int rank = comm_.rank();
  const torch::Tensor local = y - partition_.offset(rank);
  const torch::Tensor owned = local.ge(0).logical_and_(local.lt(partition_.size(rank)));
  return torch::where(owned, local, torch::full_like(local, kNoTarget));
}

torch::Tensor ShardedMarginSoftmax::sampled_rows(const torch::Tensor& local_target,
                                                 int64_t step) const {
  if (options_.sample_rate >= 1.0) return torch::Tensor();
  const int rank = comm_.rank();
  return sample_class_rows(local_target, partition_.size(rank), partition_.offset(rank),
                           options_.sample_rate, options_.seed, step);
}

void ShardedMarginSoftmax::check_labels(const torch::Tensor& y, const torch::Tensor& summary,
                                        const std::vector<int64_t>& counts) const {
  const int64_t num_classes = options_.num_classes;
  if (summary[0].item<double>() < 0 ||
      summary[1].item<double>() >= static_cast<double>(num_classes)) {
    const int64_t bad = first_true(y.lt(0).logical_or_(y.ge(num_classes)));
    MYRIAD_THROW_COLLECTIVE("label {} of {} is outside [0, {})", y[bad].item<int64_t>(),
                            sample_origin(bad, counts), num_classes);
  }
}

torch::Tensor ShardedMarginSoftmax::run_forward(const torch::Tensor& features,
                                                const torch::Tensor& labels, int64_t* step_id,
                                                bool backward) {
  NoAutocast no_autocast;
  const AgreedBeforehand agreed(comm_, parts_ != nullptr);
  auto step = std::make_unique<Step>();
  step->id = ++forwards_;
  step->backward = backward;
  *step_id = step->id;
  step->feature_dtype = features.scalar_type();
  phase("gather");
  const Gathered in = gather_inputs(*step, features, labels);
  std::optional<HostCopy> summary;
  if (!parts_) summary.emplace(summarize_inputs(in));
  normalize_features(*step, in.x);
  choose_rows(*step, in.y);
  RowStatistics local = forward_chunks(*step);
  phase("reduce_stats");
  const torch::Tensor loss = reduce_statistics(*step, local);
  if (parts_) {
    // A part's labels were checked with the step's (begin_parts), and its features are checked
    // with the other parts' at finish_parts: no host synchronisation per part.
    step->finite_rows = in.x.isfinite().all(1);
    pending_ = std::move(step);
    return loss;
  }
  check_inputs(*step, in, *summary);
  pending_ = std::move(step);
  return pending_->skip ? torch::full_like(loss, std::numeric_limits<float>::quiet_NaN()) : loss;
}

ShardedMarginSoftmax::Gathered ShardedMarginSoftmax::gather_inputs(Step& step,
                                                                   const torch::Tensor& features,
                                                                   const torch::Tensor& labels) {
  const int64_t dim = options_.embedding_size;
  // Gather first: the gathered tensors are identical on every rank, so every check below fails
  // on all ranks alike, and the collectives themselves reject ranks whose inputs disagree.
  if (parts_) {
    step.counts = part_counts(features, labels);
  } else {
    step.counts = comm_.all_gather_counts(features.dim() > 0 ? features.size(0) : 0);
  }
  const torch::Tensor x = comm_.all_gather(features.detach(), step.counts);
  const torch::Tensor y = comm_.all_gather(labels.detach(), step.counts);
  MYRIAD_CHECK_COLLECTIVE(
      x.dim() == 2 && x.size(1) == dim,
      "features have {} dimensions of width {}, but the classifier expects [batch, {}]", x.dim(),
      x.dim() > 1 ? x.size(1) : 0, dim);
  MYRIAD_CHECK_COLLECTIVE(x.is_floating_point(), "features must be floating point, got {}",
                          c10::toString(x.scalar_type()));
  MYRIAD_CHECK_COLLECTIVE(y.dim() == 1 && !y.is_floating_point() && y.scalar_type() != torch::kBool,
                          "labels must be a 1-D integer tensor");
  step.batch = x.size(0);
  MYRIAD_CHECK_COLLECTIVE(step.batch > 0 || parts_, "the global batch is empty");
  step.divisor = parts_ ? parts_->batch : step.batch;
  for (int r = 0; r < comm_.rank(); ++r) step.local_begin += step.counts[r];
  return {x, y.to(torch::kInt64)};
}

void ShardedMarginSoftmax::normalize_features(Step& step, const torch::Tensor& x) const {
  const torch::Tensor xf = x.to(torch::kFloat32);
  if (options_.margin.params().normalized) {
    const torch::Tensor norm = xf.norm(2, 1, true).clamp_min(1e-12);
    step.inv_xnorm = norm.reciprocal();
    step.xn = xf * step.inv_xnorm;
  } else {
    step.xn = xf.contiguous();
  }
  step.xg = step.xn.to(options_.gemm_dtype).contiguous();
}

void ShardedMarginSoftmax::choose_rows(Step& step, const torch::Tensor& y) {
  const int rank = comm_.rank();
  // Every part of a step takes the rows Partial FC sampled for the whole step. A forward that no
  // backward follows (an evaluation) takes the rows that the next step would, and leaves the
  // count of steps, and so training's sampling, as it was.
  const torch::Tensor local_target = local_targets(y);
  if (parts_) {
    step.active = parts_->active;
  } else {
    step.active = sampled_rows(local_target, step.backward ? ++steps_ : steps_ + 1);
  }
  if (step.active.defined()) {
    step.active_rows = step.active.size(0);
    const torch::Tensor position = torch::searchsorted(step.active, local_target.clamp_min(0));
    step.target_col = torch::where(local_target.ge(0), position, local_target);
  } else {
    step.active_rows = partition_.size(rank);
    step.target_col = local_target;
  }
  const RowSource source =
      row_source(weight_.scalar_type(), options_.gemm_dtype, step.active.defined());
  step.stored_rows = source == RowSource::kStored;
  const int64_t gemm_bytes = static_cast<int64_t>(torch::elementSize(options_.gemm_dtype));
  // The fused kernels keep no logits: their cached plan keeps the rows.
  step.plan = plan_chunks(step.active_rows, step.batch, options_.embedding_size, gemm_bytes, source,
                          options_.workspace_bytes, logits(),
                          parts_ ? RowGradientStore::kNone : row_gradient_store(step.batch));
  // A forward that no backward follows (a loss under no_grad) keeps neither logits, rows nor
  // exponentials: at 4M classes and 2048 samples per step the exponentials alone take 16 GiB.
  step.plan.cache = step.plan.cache && step.backward;
  // Where every class fits at once, the fused kernels keep each logit's exponential in the bytes
  // of its gradient, and backward needs no products of its own (a normalising margin bounds the
  // logits by s; the parts of a step recompute them).
  step.plan.kept_exponentials = fused_ && step.plan.cache && step.plan.chunks > 0 && !parts_ &&
                                options_.margin.params().normalized;
  last_plan_ = step.plan;
}

ShardedMarginSoftmax::RowStatistics ShardedMarginSoftmax::forward_chunks(Step& step) {
  const MarginParams params = options_.margin.params();
  const auto f32 = step.xn.options().dtype(torch::kFloat32);
  RowStatistics local{torch::full({step.batch}, -std::numeric_limits<float>::infinity(), f32),
                      torch::zeros({step.batch}, f32), torch::zeros({step.batch}, f32)};
  for (int64_t begin = 0; begin < step.active_rows; begin += step.plan.chunk_rows) {
    const int64_t end = std::min(begin + step.plan.chunk_rows, step.active_rows);
    phase("prepare_rows");
    torch::Tensor rows = chunk_rows(step, begin, end);
    if (step.stored_rows && params.normalized) {
      step.row_scales.push_back(stored_row_scales(begin, end));
    }
    const torch::Tensor scale = step.row_scales.empty() ? torch::Tensor() : step.row_scales.back();
    if (fused_) {
      phase("fused_logit_stats");
      if (step.plan.kept_exponentials) {
        step.kept = {torch::empty({end - begin, step.batch}, step.xg.options()),
                     torch::empty({step.batch}, f32)};
      }
      accumulate_fused_chunk_stats(step.xg, rows, scale, step.target_col, begin, params, local.max,
                                   local.sum, local.target_logit,
                                   step.plan.kept_exponentials ? &step.kept : nullptr);
      if (step.plan.cache) step.cached_rows.push_back(std::move(rows));
      continue;
    }
    torch::Tensor dot = torch::empty({end - begin, step.batch}, f32);
    phase("gemm_logits");
    gemm_f32(dot, rows, false, step.xg, true, false);
    phase("softmax_stats");
    accumulate_chunk_stats(dot, scale, step.target_col, begin, params, local.max, local.sum,
                           local.target_logit);
    if (step.plan.cache) {
      step.cached_dot.push_back(std::move(dot));
      step.cached_rows.push_back(std::move(rows));
    }
  }
  return local;
}

torch::Tensor ShardedMarginSoftmax::reduce_statistics(Step& step, RowStatistics& local) {
  // Softmax statistics across shards: the max, then sum-exp and target logit in one all-reduce.
  torch::Tensor global_max = local.max.clone();
  comm_.all_reduce(global_max, ReduceOp::kMax);
  torch::Tensor packed =
      torch::stack({local.sum.mul_(local.max.sub_(global_max).exp_()), local.target_logit}, 1)
          .contiguous();
  comm_.all_reduce(packed, ReduceOp::kSum);
  const torch::Tensor sum_exp = packed.select(1, 0);
  step.row_max = global_max;
  step.row_inv_sum = sum_exp.reciprocal();
  // The samples' share of the mean loss over the whole step's batch.
  return (sum_exp.log() + global_max - packed.select(1, 1)).sum() /
         static_cast<double>(step.divisor);
}

HostCopy ShardedMarginSoftmax::summarize_inputs(const Gathered& in) {
  return HostCopy(torch::stack({in.y.min().to(torch::kFloat64), in.y.max().to(torch::kFloat64),
                                in.x.isfinite().all().to(torch::kFloat64)}));
}

void ShardedMarginSoftmax::check_inputs(Step& step, const Gathered& in, HostCopy& summary) const {
  // One host synchronisation validates labels and features, once all of forward is queued. It
  // waits for the summary alone, queued right after the gather, so the device works through
  // forward while the host checks and queues backward. (Waiting for all of forward left the
  // device idle until backward's first kernel: 0.36 ms of a 2.19 ms step at 500K classes and
  // 256 samples on one H200.) Until here bad values are harmless: labels outside [0, C) belong
  // to no shard, and non-finite features only make non-finite logits.
  const torch::Tensor& values = summary.get();
  check_labels(in.y, values, step.counts);
  if (values[2].item<double>() != 0.0) return;
  if (options_.non_finite == NonFinitePolicy::kError) {
    const int64_t bad = first_true(in.x.isfinite().all(1).logical_not_());
    MYRIAD_THROW_COLLECTIVE("the features of {} contain NaN or infinity",
                            sample_origin(bad, step.counts));
  }
  step.skip = true;
  step.cached_dot.clear();
  step.cached_rows.clear();
  step.kept = {};
}

ShardedMarginSoftmax::GradientScale ShardedMarginSoftmax::gradient_scale(const torch::Tensor& grad,
                                                                         int64_t divisor) const {
  // The incoming gradient carries fp16 training's loss scale. float16 GEMMs take the logits'
  // gradient at no more than 2^13 B / s, where it fits float16 (a softmax gradient is at most s/B,
  // times |dpsi/dcos|, below 8 for the margins in use); dX̂ and the rows' gradient are brought to
  // the incoming scale afterwards, in float32. At 65536, the fp16 scaler's start, and a small
  // batch, the logits' gradient would otherwise overflow and corrupt the rows before the
  // backbone's overflow check could skip anything.
  GradientScale g;
  const torch::Tensor upstream = grad.to(torch::kFloat32).reshape({1});
  torch::Tensor taken = upstream;
  if (options_.gemm_dtype == torch::kFloat16) {
    const double cap = std::exp2(std::floor(
        std::log2(8192.0 * static_cast<double>(divisor) / options_.margin.params().scale)));
    taken = upstream.clamp_max(cap);
    g.rescale = upstream / taken;
  }
  g.coef = taken / static_cast<double>(divisor);
  g.multiplier = inv_loss_scale_;
  if (g.rescale.defined())
    g.multiplier = g.multiplier.defined() ? g.multiplier * g.rescale : g.rescale;
  return g;
}

torch::Tensor ShardedMarginSoftmax::chunk_logits(Step& step, int64_t c, int64_t begin, int64_t end,
                                                 torch::Tensor& dot) {
  if (step.plan.cache) {
    if (!fused_) dot = std::move(step.cached_dot[c]);
    return std::move(step.cached_rows[c]);
  }
  phase("prepare_rows");
  torch::Tensor rows = chunk_rows(step, begin, end);
  if (fused_) return rows;  // the fused kernel recomputes the logits itself
  dot = torch::empty({end - begin, step.batch}, step.xg.options().dtype(torch::kFloat32));
  phase("gemm_logits");
  gemm_f32(dot, rows, false, step.xg, true, false);
  return rows;
}

bool ShardedMarginSoftmax::takes_fused_update(int64_t batch) const {
  return fused_update_ && fused_update_chosen(options_.fused_update, batch) &&
         ShardOptimizer::updates_from_logit_grad(options_.optimizer.kind, batch,
                                                 options_.embedding_size, options_.weight_dtype);
}

RowGradientStore ShardedMarginSoftmax::row_gradient_store(int64_t batch) const {
  if (takes_fused_update(batch)) return RowGradientStore::kNone;
  return myriad::row_gradient_store(options_.weight_dtype, options_.gemm_dtype,
                                    options_.update == WeightUpdate::kFused);
}

torch::Tensor ShardedMarginSoftmax::kept_factor(Step& step, const GradientScale& g) {
  if (!step.plan.kept_exponentials) return {};
  // dX̂ is scaled by the factor after its product, which is the product of one chunk alone.
  MYRIAD_CHECK(step.plan.chunks == 1, "the kept exponentials take one chunk, not {}",
               step.plan.chunks);
  phase("kept_logit_grad");
  const torch::Tensor scale = step.row_scales.empty() ? torch::Tensor() : step.row_scales[0];
  return finish_kept_exponentials(step.kept, step.xg, step.cached_rows[0], scale, step.target_col,
                                  0, step.row_max, step.row_inv_sum, g.coef,
                                  options_.margin.params());
}

bool ShardedMarginSoftmax::norms_from_update() const {
  const UpdatedNorms& u = updated_norms_;
  return u.version >= 0 && u.version == weight_._version() && u.storage == weight_.data_ptr() &&
         u.inv_norms.size(0) == weight_.size(0);
}

torch::Tensor ShardedMarginSoftmax::stored_row_scales(int64_t begin, int64_t end) const {
  if (norms_from_update()) return updated_norms_.inv_norms.slice(0, begin, end);
  return chunk_inv_norms(weight_, begin, end);
}

float* ShardedMarginSoftmax::update_norms_target(const Step& step) {
  if (!step.stored_rows || !options_.margin.params().normalized || !weight_.is_cuda() ||
      step.active.defined() || options_.optimizer.kind != OptimizerKind::kSgd) {
    return nullptr;
  }
  torch::Tensor& norms = updated_norms_.inv_norms;
  if (!norms.defined() || norms.size(0) != weight_.size(0) || norms.device() != weight_.device()) {
    norms = torch::empty({weight_.size(0)}, weight_.options().dtype(torch::kFloat32));
  }
  return norms.data_ptr<float>();
}

void ShardedMarginSoftmax::backward_chunks(Step& step, const GradientScale& g, torch::Tensor* dxn,
                                           bool update) {
  const MarginParams params = options_.margin.params();
  const bool fused_update = update && takes_fused_update(step.batch);
  // From kept exponentials the logits' gradient is kept[j, b] factor[b]: the rows' gradient takes
  // the features times the factor (rounded to the GEMM dtype once, from float32), and dX̂ takes
  // it after its product (one chunk: dX̂ is that product alone).
  const torch::Tensor factor = kept_factor(step, g);
  const torch::Tensor row_features =
      factor.defined() ? (step.xn * factor.unsqueeze(1)).to(options_.gemm_dtype) : step.xg;
  // The fused update reads the features transposed, [D, B]; one copy serves every chunk.
  const torch::Tensor xt =
      fused_update ? optimizer_->logit_grad_update_features(row_features) : torch::Tensor();
  // The rows change below: their norms stay current only where the update writes them all.
  float* norms = update && !fused_update && options_.update == WeightUpdate::kFused
                     ? update_norms_target(step)
                     : nullptr;
  bool norms_written = norms != nullptr;
  if (update) updated_norms_.version = -1;
  for (int64_t c = 0; c < step.plan.chunks; ++c) {
    const int64_t begin = c * step.plan.chunk_rows;
    const int64_t end = std::min(begin + step.plan.chunk_rows, step.active_rows);
    torch::Tensor dot;
    torch::Tensor rows = chunk_logits(step, c, begin, end, dot);
    const torch::Tensor scale = step.row_scales.empty() ? torch::Tensor() : step.row_scales[c];
    torch::Tensor logit_grad;
    if (factor.defined()) {
      logit_grad = std::move(step.kept.matrix);
    } else if (fused_) {
      phase("fused_logit_grad");
      logit_grad = fused_chunk_logit_grad(step.xg, rows, scale, step.target_col, begin,
                                          step.row_max, step.row_inv_sum, g.coef, params);
    } else {
      phase("logit_grad");
      logit_grad = chunk_logit_grad(dot, scale, step.target_col, begin, step.row_max,
                                    step.row_inv_sum, g.coef, params, options_.gemm_dtype);
      dot = torch::Tensor();
    }
    if (dxn != nullptr) {
      phase("gemm_feature_grad");
      gemm_f32_long_k(*dxn, logit_grad, rows, true);
      if (factor.defined()) dxn->mul_(factor.unsqueeze(1));
    }
    rows = torch::Tensor();
    if (!update) continue;
    const RowGradient grad_of = !params.normalized ? RowGradient::kRow
                                : scale.defined()  ? RowGradient::kUnitRowOverNorm
                                                   : RowGradient::kUnitRow;
    if (fused_update) {
      phase("fused_update");
      optimizer_->update_rows_from_logit_grad(weight_, step.active, begin, end, logit_grad, xt,
                                              grad_of, g.multiplier);
      continue;
    }
    phase("gemm_weight_grad");
    torch::Tensor row_grad =
        torch::empty({end - begin, options_.embedding_size},
                     step.xg.options().dtype(row_gradient_dtype(row_gradient_store(step.batch))));
    gemm_f32(row_grad, logit_grad, false, row_features, false, false);
    phase("update");
    if (options_.update == WeightUpdate::kFused) {
      norms_written = optimizer_->update_rows(weight_, step.active, begin, end, row_grad, grad_of,
                                              g.multiplier, norms) &&
                      norms_written;
    } else {
      const torch::Tensor index =
          step.active.defined() ? step.active.slice(0, begin, end)
                                : torch::arange(begin, end, step.xg.options().dtype(torch::kInt64));
      const torch::Tensor w = weight_.index_select(0, index).to(torch::kFloat32);
      weight_grad_.index_add_(
          0, index,
          row_grad_of_rows(w, g.rescale.defined() ? row_grad.mul_(g.rescale) : row_grad, grad_of));
    }
  }
  if (norms_written && step.plan.chunks > 0) {
    updated_norms_.storage = weight_.data_ptr();
    updated_norms_.version = weight_._version();
  }
}

torch::Tensor ShardedMarginSoftmax::run_backward(int64_t step_id, const torch::Tensor& grad) {
  MYRIAD_CHECK(pending_ && pending_->id == step_id,
               "classifier backward of step {} came after a later forward; run backward before the "
               "next forward",
               step_id);
  NoAutocast no_autocast;
  const AgreedBeforehand agreed(comm_, parts_ != nullptr);
  std::unique_ptr<Step> step = std::move(pending_);
  const MarginParams params = options_.margin.params();
  const int rank = comm_.rank();
  const int64_t local_rows = step->counts[rank];
  const auto local_options = torch::dtype(step->feature_dtype).device(device_);
  if (step->skip) return torch::zeros({local_rows, options_.embedding_size}, local_options);

  const GradientScale g = gradient_scale(grad, step->divisor);
  torch::Tensor dxn = torch::zeros({step->batch, options_.embedding_size}, step->xn.options());
  // A part of a step gives its features' gradient now and leaves the rows to finish_parts.
  const bool update = !parts_;
  if (update && options_.update == WeightUpdate::kFused) optimizer_->begin_step();
  backward_chunks(*step, g, &dxn, update);
  if (g.rescale.defined()) dxn.mul_(g.rescale);

  phase("reduce_scatter");
  torch::Tensor local = comm_.reduce_scatter(dxn, step->counts);
  if (params.normalized) {
    const torch::Tensor xn = step->xn.slice(0, step->local_begin, step->local_begin + local_rows);
    local = (local - xn * (xn * local).sum(1, true)) *
            step->inv_xnorm.slice(0, step->local_begin, step->local_begin + local_rows);
  }
  if (parts_) {
    // Kept for the update: the GEMM operand and the statistics of the part's samples.
    if (!parts_->upstream.defined()) parts_->upstream = grad.to(torch::kFloat32).reshape({1});
    step->xn = step->inv_xnorm = torch::Tensor();
    step->row_scales.clear();
    parts_->done.push_back(std::move(step));
  }
  return local.to(local_options.dtype());
}

void ShardedMarginSoftmax::begin_parts(const torch::Tensor& labels,
                                       const std::vector<int64_t>& part_rows) {
  MYRIAD_CHECK(!parts_, "begin_parts: the previous step's parts were not finished");
  NoAutocast no_autocast;
  auto parts = std::make_unique<Parts>();
  parts->counts = comm_.all_gather_counts(labels.dim() > 0 ? labels.size(0) : 0);
  parts->part_counts = agree_part_rows(part_rows, parts->counts);
  torch::Tensor y = comm_.all_gather(labels.detach(), parts->counts);
  MYRIAD_CHECK_COLLECTIVE(y.dim() == 1 && !y.is_floating_point() && y.scalar_type() != torch::kBool,
                          "labels must be a 1-D integer tensor");
  parts->batch = y.size(0);
  MYRIAD_CHECK_COLLECTIVE(parts->batch > 0, "the global batch is empty");
  y = y.to(torch::kInt64);
  // The step's one host synchronisation for labels, before any part is queued.
  const torch::Tensor summary =
      torch::stack({y.min().to(torch::kFloat64), y.max().to(torch::kFloat64)}).cpu();
  check_labels(y, summary, parts->counts);
  parts->active = sampled_rows(local_targets(y), ++steps_);
  parts_ = std::move(parts);
}

std::vector<std::vector<int64_t>> ShardedMarginSoftmax::agree_part_rows(
    const std::vector<int64_t>& part_rows, const std::vector<int64_t>& labels) const {
  // Every rank's number of parts, then each part's rows; a rank whose own rows are malformed
  // sends -1 there, so that every rank fails alike, naming it.
  const int rank = comm_.rank();
  const std::vector<int64_t> parts =
      comm_.all_gather_counts(static_cast<int64_t>(part_rows.size()));
  for (int r = 0; r < comm_.size(); ++r) {
    MYRIAD_CHECK_COLLECTIVE(parts[r] == parts[0],
                            "begin_parts: rank {} cuts the step into {} parts, rank 0 into {}", r,
                            parts[r], parts[0]);
  }
  MYRIAD_CHECK_COLLECTIVE(parts[0] > 0, "begin_parts: a step in no parts");
  const bool malformed =
      std::accumulate(part_rows.begin(), part_rows.end(), int64_t{0}) != labels[rank] ||
      std::any_of(part_rows.begin(), part_rows.end(), [](int64_t rows) { return rows < 0; });
  std::vector<std::vector<int64_t>> counts;
  for (const int64_t rows : part_rows) {
    counts.push_back(comm_.all_gather_counts(malformed ? -1 : rows));
    for (int r = 0; r < comm_.size(); ++r) {
      MYRIAD_CHECK_COLLECTIVE(
          counts.back()[r] >= 0,
          "begin_parts: rank {}'s rows of its parts do not sum to its {} labels", r, labels[r]);
    }
  }
  return counts;
}

std::vector<int64_t> ShardedMarginSoftmax::part_counts(const torch::Tensor& features,
                                                       const torch::Tensor& labels) {
  const size_t part = parts_->forwarded;
  MYRIAD_CHECK(part < parts_->part_counts.size(),
               "a forward beyond the {} parts that begin_parts agreed on",
               parts_->part_counts.size());
  const std::vector<int64_t>& counts = parts_->part_counts[part];
  const int64_t rows = counts[comm_.rank()];
  MYRIAD_CHECK(
      features.dim() == 2 && features.size(0) == rows &&
          features.size(1) == options_.embedding_size && features.scalar_type() == torch::kFloat32,
      "part {}: this rank's features must be float32 [{}, {}], as begin_parts agreed; got "
      "{} {}",
      part, rows, options_.embedding_size, c10::toString(features.scalar_type()), features.sizes());
  MYRIAD_CHECK(labels.dim() == 1 && labels.size(0) == rows && labels.scalar_type() == torch::kInt64,
               "part {}: this rank's labels must be int64 [{}], as begin_parts agreed; got {} {}",
               part, rows, c10::toString(labels.scalar_type()), labels.sizes());
  ++parts_->forwarded;
  return counts;
}

void ShardedMarginSoftmax::finish_parts() {
  MYRIAD_CHECK(parts_ && !pending_, "finish_parts: {}",
               parts_ ? "a part's forward had no backward" : "no step in parts was begun");
  NoAutocast no_autocast;
  const std::unique_ptr<Parts> parts = std::move(parts_);
  const int64_t dim = options_.embedding_size;
  Step whole;
  std::vector<torch::Tensor> xg, target_col, row_max, row_inv_sum, finite_rows;
  for (const std::unique_ptr<Step>& part : parts->done) {
    whole.batch += part->batch;
    xg.push_back(part->xg);
    target_col.push_back(part->target_col);
    row_max.push_back(part->row_max);
    row_inv_sum.push_back(part->row_inv_sum);
    finite_rows.push_back(part->finite_rows);
  }
  MYRIAD_CHECK(whole.batch == parts->batch,
               "finish_parts: the parts hold {} of the step's {} samples", whole.batch,
               parts->batch);
  // Features of every part: one host synchronisation.
  const torch::Tensor finite = torch::cat(finite_rows);
  if (!finite.all().item<bool>()) {
    if (options_.non_finite == NonFinitePolicy::kError) {
      int64_t bad = first_true(finite.logical_not());
      size_t p = 0;
      for (; bad >= parts->done[p]->batch; ++p) bad -= parts->done[p]->batch;
      MYRIAD_THROW_COLLECTIVE("the features of {} in micro-batch {} contain NaN or infinity",
                              sample_origin(bad, parts->done[p]->counts), p);
    }
    return;  // the parts' losses are NaN; the step is skipped
  }
  whole.xg = torch::cat(xg);
  whole.target_col = torch::cat(target_col);
  whole.row_max = torch::cat(row_max);
  whole.row_inv_sum = torch::cat(row_inv_sum);
  whole.active = parts->active;
  whole.active_rows = whole.active.defined() ? whole.active.size(0) : partition_.size(comm_.rank());
  const RowSource source =
      row_source(weight_.scalar_type(), options_.gemm_dtype, whole.active.defined());
  whole.stored_rows = source == RowSource::kStored;
  whole.plan = plan_chunks(whole.active_rows, whole.batch, dim,
                           static_cast<int64_t>(torch::elementSize(options_.gemm_dtype)), source,
                           options_.workspace_bytes, logits(), row_gradient_store(whole.batch));
  whole.plan.cache = false;  // the logits are recomputed chunk by chunk: nothing was kept
  // GEMMs on the stored rows take each chunk's 1/|w|, as in forward.
  if (whole.stored_rows && options_.margin.params().normalized) {
    for (int64_t begin = 0; begin < whole.active_rows; begin += whole.plan.chunk_rows) {
      whole.row_scales.push_back(
          stored_row_scales(begin, std::min(begin + whole.plan.chunk_rows, whole.active_rows)));
    }
  }
  if (options_.update == WeightUpdate::kFused) optimizer_->begin_step();
  backward_chunks(whole, gradient_scale(parts->upstream, parts->batch), nullptr, /*update=*/true);
}

torch::Tensor ShardedMarginSoftmax::predict(const torch::Tensor& features) {
  torch::NoGradGuard no_grad;
  NoAutocast no_autocast;
  const MarginParams params = options_.margin.params();
  const int rank = comm_.rank();
  const std::vector<int64_t> counts =
      comm_.all_gather_counts(features.dim() > 0 ? features.size(0) : 0);
  const torch::Tensor x = comm_.all_gather(features.detach(), counts);
  MYRIAD_CHECK_COLLECTIVE(x.dim() == 2 && x.size(1) == options_.embedding_size,
                          "features have the wrong shape for the classifier (expected [batch, {}])",
                          options_.embedding_size);
  const int64_t batch = x.size(0);
  torch::Tensor xn = x.to(torch::kFloat32);
  if (params.normalized) xn = xn / xn.norm(2, 1, true).clamp_min(1e-12);
  const torch::Tensor xg = xn.to(options_.gemm_dtype).contiguous();
  const int64_t shard_rows = partition_.size(rank);
  const int64_t offset = partition_.offset(rank);
  const ChunkPlan plan = plan_chunks(shard_rows, batch, options_.embedding_size,
                                     static_cast<int64_t>(torch::elementSize(options_.gemm_dtype)),
                                     RowSource::kCopy, options_.workspace_bytes);
  torch::Tensor best = torch::full({batch}, -std::numeric_limits<float>::infinity(), xn.options());
  torch::Tensor best_class = torch::zeros({batch}, xn.options().dtype(torch::kInt64));
  for (int64_t begin = 0; begin < shard_rows; begin += plan.chunk_rows) {
    const int64_t end = std::min(begin + plan.chunk_rows, shard_rows);
    const torch::Tensor rows = prepare_chunk_rows(weight_, torch::Tensor(), begin, end,
                                                  options_.gemm_dtype, params.normalized);
    torch::Tensor dot = torch::empty({end - begin, batch}, xn.options());
    gemm_f32(dot, rows, false, xg, true, false);
    const auto [value, column] = dot.max(0);
    const torch::Tensor better = value.gt(best);
    best = torch::where(better, value, best);
    best_class = torch::where(better, column + (offset + begin), best_class);
  }
  // The best score over all shards; among shards that reach it, the smallest class id.
  torch::Tensor global_best = best.clone();
  comm_.all_reduce(global_best, ReduceOp::kMax);
  torch::Tensor winner =
      torch::where(best.eq(global_best), best_class,
                   torch::full_like(best_class, std::numeric_limits<int64_t>::max()));
  comm_.all_reduce(winner, ReduceOp::kMin);
  int64_t local_begin = 0;
  for (int r = 0; r < rank; ++r) local_begin += counts[r];
  return winner.slice(0, local_begin, local_begin + counts[rank]);
}

}  // namespace myriad
