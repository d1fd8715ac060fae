#include "myriad/classifier/sharded_softmax.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "logits_path.h"
#include "myriad/classifier/mixed_gemm.h"
#include "myriad/classifier/partial_fc.h"
#include "myriad/comm/communicator.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"
#include "myriad/util/host_copy.h"
#include "row_updater.h"
#include "softmax_step.h"

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

// A step whose batch comes in parts: what begin_parts fixed, and each part once its backward ran.
struct ShardedMarginSoftmax::Parts {
  std::vector<int64_t> counts;                    // every rank's labels of the whole step
  std::vector<std::vector<int64_t>> part_counts;  // every rank's rows of each part
  size_t forwarded = 0;                           // parts forwarded so far
  int64_t batch = 0;                              // the whole step's global batch
  torch::Tensor active;                           // Partial FC's rows for every part
  torch::Tensor upstream;                         // the incoming gradient of the parts' backward
  std::vector<std::unique_ptr<SoftmaxStep>> done;
};

namespace {

// What the autograd context keeps of a forward: the module and which of its forwards it was.
struct ForwardHandle : torch::CustomClassHolder {
  ForwardHandle(ShardedMarginSoftmax* module, int64_t step) : module(module), step(step) {}
  ShardedMarginSoftmax* module;
  int64_t step;
};

class ShardedSoftmaxFunction : public torch::autograd::Function<ShardedSoftmaxFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& features,
                               const torch::Tensor& labels, ShardedMarginSoftmax* module) {
    int64_t step = 0;
    torch::Tensor loss = module->run_forward(features, labels, &step);
    ctx->saved_data["forward"] =
        c10::IValue::make_capsule(c10::make_intrusive<ForwardHandle>(module, step));
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto handle =
        c10::static_intrusive_pointer_cast<ForwardHandle>(ctx->saved_data["forward"].toCapsule());
    return {handle->module->run_backward(handle->step, grads[0]), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor initial_shard(int64_t first, int64_t rows, const ShardedSoftmaxOptions& options,
                            const torch::Device& device) {
  return hashed_normal_rows(first, rows, options.embedding_size, options.init_std, options.seed,
                            options.weight_dtype, device);
}

namespace {

// The options' own errors, on every rank before anything is allocated.
void check_options(const ShardedSoftmaxOptions& options) {
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
}

}  // namespace

ShardedMarginSoftmax::ShardedMarginSoftmax(Communicator& comm, const ShardedSoftmaxOptions& options,
                                           const torch::Device& device)
    : comm_(comm),
      options_(options),
      device_(device),
      partition_(options.num_classes, comm.size()),
      phases_(std::make_unique<PhaseMarks>()) {
  check_options(options);
  const bool fused = options.fused_kernels != FusedKernels::kOff &&
                     fused_chunks_apply(device, options.embedding_size, options.gemm_dtype);
  logits_ = make_logits_path(fused, options.margin.params(), options.gemm_dtype, device, *phases_);
  MYRIAD_CHECK_COLLECTIVE(fused || options.fused_kernels != FusedKernels::kRequired,
                          "the fused classifier kernels need an H100 or H200 GPU, bf16 GEMMs and "
                          "an embedding size that is a multiple of 8 up to 512 (this run: {}, {} "
                          "GEMMs, embedding size {})",
                          logits_->describe(), c10::toString(options.gemm_dtype),
                          options.embedding_size);
  const bool fused_update =
      fused && options.update == WeightUpdate::kFused &&
      options.fused_update != FusedUpdate::kOff &&
      ShardOptimizer::updates_from_logit_grad(options.optimizer.kind, 8, options.embedding_size,
                                              options.weight_dtype);
  MYRIAD_CHECK_COLLECTIVE(
      fused_update || options.fused_update != FusedUpdate::kOn,
      "the fused weight update needs the fused classifier kernels, SGD and bfloat16 weights that "
      "the classifier updates (this run: {}, {}, {} weights)",
      logits_->describe(), optimizer_name(options.optimizer.kind),
      c10::toString(options.weight_dtype));
  const int64_t rows = partition_.size(comm.rank());
  const int64_t first = partition_.offset(comm.rank());
  weight_ = initial_shard(first, rows, options, device);
  if (options.update == WeightUpdate::kAccumulateGrad) {
    weight_grad_ = torch::zeros(weight_.sizes(), weight_.options().dtype(torch::kFloat32));
  }
  optimizer_ = std::make_unique<ShardOptimizer>(options.optimizer, rows, options.embedding_size,
                                                device, first, options.seed);
  updater_ = make_row_updater(options_, fused_update, *optimizer_, weight_, weight_grad_, *phases_);
}

std::string ShardedMarginSoftmax::kernels() const {
  return logits_->describe() + "; rows: " + updater_->describe();
}

std::string ShardedMarginSoftmax::kept_for_backward() const {
  return last_plan_.cache ? logits_->kept_for_backward(last_plan_) : "recompute in backward";
}

bool ShardedMarginSoftmax::fused() const {
  return logits_->logits() == Logits::kInRegisters;
}

Logits ShardedMarginSoftmax::logits() const {
  return logits_->logits();
}

bool ShardedMarginSoftmax::norms_from_update() const {
  return updater_->current_norms().defined();
}

bool ShardedMarginSoftmax::copy_from_update() const {
  return updater_->current_copy().defined();
}

void ShardedMarginSoftmax::set_phase_timer(PhaseTimer* timer) {
  phases_->set_timer(timer);
}

ShardedMarginSoftmax::~ShardedMarginSoftmax() = default;

torch::Tensor ShardedMarginSoftmax::chunk_rows(const SoftmaxStep& step, int64_t begin,
                                               int64_t end) {
  if (step.stored_rows) return weight_.slice(0, begin, end);
  const torch::Tensor copy = updater_->current_copy();
  if (copy.defined() && !step.active.defined()) return copy.slice(0, begin, end);
  return prepare_chunk_rows(weight_, step.active, begin, end, options_.gemm_dtype,
                            options_.margin.params().normalized);
}

void ShardedMarginSoftmax::phase(const char* name) {
  (*phases_)(name);
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
  auto step = std::make_unique<SoftmaxStep>();
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

ShardedMarginSoftmax::Gathered ShardedMarginSoftmax::gather_inputs(SoftmaxStep& step,
                                                                   const torch::Tensor& features,
                                                                   const torch::Tensor& labels) {
  // Gather first: the gathered tensors are identical on every rank, so every check below fails
  // on all ranks alike, and the collectives themselves reject ranks whose inputs disagree.
  if (parts_) {
    step.counts = part_counts(features, labels);
  } else {
    step.counts = comm_.all_gather_counts(features.dim() > 0 ? features.size(0) : 0);
  }
  const torch::Tensor x = gather_features(step, features);
  const torch::Tensor y = comm_.all_gather(labels.detach(), step.counts);
  MYRIAD_CHECK_COLLECTIVE(y.dim() == 1 && !y.is_floating_point() && y.scalar_type() != torch::kBool,
                          "labels must be a 1-D integer tensor");
  MYRIAD_CHECK_COLLECTIVE(step.batch > 0 || parts_, "the global batch is empty");
  step.divisor = parts_ ? parts_->batch : step.batch;
  return {x, y.to(torch::kInt64)};
}

torch::Tensor ShardedMarginSoftmax::gather_features(SoftmaxStep& step,
                                                    const torch::Tensor& features) const {
  const int64_t dim = options_.embedding_size;
  const torch::Tensor x = comm_.all_gather(features.detach(), step.counts);
  MYRIAD_CHECK_COLLECTIVE(
      x.dim() == 2 && x.size(1) == dim,
      "features have {} dimensions of width {}, but the classifier expects [batch, {}]", x.dim(),
      x.dim() > 1 ? x.size(1) : 0, dim);
  MYRIAD_CHECK_COLLECTIVE(x.is_floating_point(), "features must be floating point, got {}",
                          c10::toString(x.scalar_type()));
  step.batch = x.size(0);
  for (int r = 0; r < comm_.rank(); ++r) step.local_begin += step.counts[r];
  return x;
}

void ShardedMarginSoftmax::normalize_features(SoftmaxStep& step, const torch::Tensor& x) const {
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

void ShardedMarginSoftmax::choose_rows(SoftmaxStep& step, const torch::Tensor& y) {
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
    const torch::Tensor position = torch::searchsorted(step.active, local_target.clamp_min(0));
    step.target_col = torch::where(local_target.ge(0), position, local_target);
  } else {
    step.target_col = local_target;
  }
  plan_step(step, parts_ ? StepUse::kPart : StepUse::kWhole);
  last_plan_ = step.plan;
}

void ShardedMarginSoftmax::plan_step(SoftmaxStep& step, StepUse use) const {
  const bool normalized = options_.margin.params().normalized;
  step.active_rows = step.active.defined() ? step.active.size(0) : partition_.size(comm_.rank());
  // A prediction reads normalised copies of the rows, as the logits of a normalising margin are.
  const RowSource source =
      use == StepUse::kPredict
          ? RowSource::kCopy
          : row_source(weight_.scalar_type(), options_.gemm_dtype, step.active.defined());
  step.stored_rows = source == RowSource::kStored;
  const bool updates = use == StepUse::kWhole || use == StepUse::kFinishParts;
  step.plan = plan_chunks(step.active_rows, step.batch, options_.embedding_size,
                          static_cast<int64_t>(torch::elementSize(options_.gemm_dtype)), source,
                          options_.workspace_bytes,
                          use == StepUse::kPredict ? Logits::kInMemory : logits_->logits(),
                          updates ? updater_->gradient_store(step.batch) : RowGradientStore::kNone);
  // A forward that no backward follows (a loss under no_grad) keeps neither logits, rows nor
  // exponentials: at 4M classes and 2048 samples per step the exponentials alone take 16 GiB. The
  // update of a step in parts recomputes the logits chunk by chunk: nothing was kept for it.
  step.plan.cache =
      step.plan.cache && step.backward && use != StepUse::kFinishParts && use != StepUse::kPredict;
  // Where every class fits at once, the fused kernels keep each logit's exponential in the bytes
  // of its gradient, and backward needs no products of its own (the parts of a step recompute
  // them). A normalising margin bounds the logits by s; plain softmax's take a bound per sample.
  step.plan.kept_exponentials = logits_->keeps_exponentials() && step.plan.cache &&
                                step.plan.chunks > 0 && use == StepUse::kWhole;
  if (step.plan.kept_exponentials) {
    (*phases_)("prepare_rows");
    step.kept.reference = normalized ? torch::full({step.batch}, options_.margin.params().scale,
                                                   step.xn.options().dtype(torch::kFloat32))
                                     : logit_bounds(step.xn, stored_row_scales(0, weight_.size(0)));
  }
  // GEMMs on the stored rows take each chunk's 1/|w|.
  if (!step.stored_rows || !normalized) return;
  (*phases_)("prepare_rows");
  for (int64_t c = 0; c < step.plan.chunks; ++c) {
    step.row_scales.push_back(stored_row_scales(step.chunk_begin(c), step.chunk_end(c)));
  }
}

RowStatistics ShardedMarginSoftmax::forward_chunks(SoftmaxStep& step) {
  const auto f32 = step.xn.options().dtype(torch::kFloat32);
  RowStatistics local{torch::full({step.batch}, -std::numeric_limits<float>::infinity(), f32),
                      torch::zeros({step.batch}, f32), torch::zeros({step.batch}, f32)};
  for (int64_t c = 0; c < step.plan.chunks; ++c) {
    phase("prepare_rows");
    torch::Tensor rows = chunk_rows(step, step.chunk_begin(c), step.chunk_end(c));
    logits_->forward_chunk(step, rows, c, local);
    if (step.plan.cache) step.cached_rows.push_back(std::move(rows));
  }
  return local;
}

torch::Tensor ShardedMarginSoftmax::reduce_statistics(SoftmaxStep& step, RowStatistics& local) {
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

void ShardedMarginSoftmax::check_inputs(SoftmaxStep& step, const Gathered& in,
                                        HostCopy& summary) const {
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

GradientScale ShardedMarginSoftmax::gradient_scale(const torch::Tensor& grad,
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

torch::Tensor ShardedMarginSoftmax::stored_row_scales(int64_t begin, int64_t end) const {
  const torch::Tensor norms = updater_->current_norms();
  return norms.defined() ? norms.slice(0, begin, end) : chunk_inv_norms(weight_, begin, end);
}

torch::Tensor ShardedMarginSoftmax::chunk_operand(SoftmaxStep& step, int64_t c) {
  if (step.plan.cache) return std::move(step.cached_rows[static_cast<size_t>(c)]);
  phase("prepare_rows");
  return chunk_rows(step, step.chunk_begin(c), step.chunk_end(c));
}

void ShardedMarginSoftmax::backward_chunks(SoftmaxStep& step, const GradientScale& g,
                                           torch::Tensor* dxn, RowUpdater* updater) {
  const torch::Tensor factor = logits_->begin_backward(step, g);
  if (updater != nullptr) updater->begin(step, factor, g);
  for (int64_t c = 0; c < step.plan.chunks; ++c) {
    torch::Tensor rows = chunk_operand(step, c);
    const torch::Tensor logit_grad = logits_->logit_grad(step, rows, c, g);
    if (dxn != nullptr) {
      phase("gemm_feature_grad");
      gemm_f32_long_k(*dxn, logit_grad, rows, true);
      // From kept exponentials dX̂ takes the factor after its product: that of one chunk alone.
      if (factor.defined()) dxn->mul_(factor.unsqueeze(1));
    }
    rows = torch::Tensor();
    if (updater != nullptr) updater->update_chunk(step, c, logit_grad);
  }
  if (updater != nullptr) updater->finish(step);
}

torch::Tensor ShardedMarginSoftmax::run_backward(int64_t step_id, const torch::Tensor& grad) {
  MYRIAD_CHECK(pending_ && pending_->id == step_id,
               "classifier backward of step {} came after a later forward; run backward before the "
               "next forward",
               step_id);
  NoAutocast no_autocast;
  const AgreedBeforehand agreed(comm_, parts_ != nullptr);
  std::unique_ptr<SoftmaxStep> step = std::move(pending_);
  const MarginParams params = options_.margin.params();
  const int rank = comm_.rank();
  const int64_t local_rows = step->counts[rank];
  const auto local_options = torch::dtype(step->feature_dtype).device(device_);
  if (step->skip) return torch::zeros({local_rows, options_.embedding_size}, local_options);

  const GradientScale g = gradient_scale(grad, step->divisor);
  torch::Tensor dxn = torch::zeros({step->batch, options_.embedding_size}, step->xn.options());
  // A part of a step gives its features' gradient now and leaves the rows to finish_parts.
  backward_chunks(*step, g, &dxn, parts_ ? nullptr : updater_.get());
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
  int64_t batch = 0;
  for (const std::unique_ptr<SoftmaxStep>& part : parts->done) batch += part->batch;
  MYRIAD_CHECK(batch == parts->batch, "finish_parts: the parts hold {} of the step's {} samples",
               batch, parts->batch);
  if (!parts_finite(*parts)) return;  // the parts' losses are NaN; the step is skipped
  SoftmaxStep whole;
  whole.batch = batch;
  const auto cat = [&](torch::Tensor SoftmaxStep::*member) {
    std::vector<torch::Tensor> pieces;
    for (const std::unique_ptr<SoftmaxStep>& part : parts->done) pieces.push_back((*part).*member);
    return torch::cat(pieces);
  };
  whole.xg = cat(&SoftmaxStep::xg);
  whole.target_col = cat(&SoftmaxStep::target_col);
  whole.row_max = cat(&SoftmaxStep::row_max);
  whole.row_inv_sum = cat(&SoftmaxStep::row_inv_sum);
  whole.active = parts->active;
  plan_step(whole, StepUse::kFinishParts);
  backward_chunks(whole, gradient_scale(parts->upstream, parts->batch), nullptr, updater_.get());
}

bool ShardedMarginSoftmax::parts_finite(const Parts& parts) const {
  // Features of every part: one host synchronisation.
  std::vector<torch::Tensor> finite_rows;
  for (const std::unique_ptr<SoftmaxStep>& part : parts.done)
    finite_rows.push_back(part->finite_rows);
  const torch::Tensor finite = torch::cat(finite_rows);
  if (finite.all().item<bool>()) return true;
  if (options_.non_finite == NonFinitePolicy::kSkip) return false;
  int64_t bad = first_true(finite.logical_not());
  size_t p = 0;
  for (; bad >= parts.done[p]->batch; ++p) bad -= parts.done[p]->batch;
  MYRIAD_THROW_COLLECTIVE("the features of {} in micro-batch {} contain NaN or infinity",
                          sample_origin(bad, parts.done[p]->counts), p);
}

torch::Tensor ShardedMarginSoftmax::predict(const torch::Tensor& features) {
  torch::NoGradGuard no_grad;
  NoAutocast no_autocast;
  SoftmaxStep step;
  step.backward = false;
  step.counts = comm_.all_gather_counts(features.dim() > 0 ? features.size(0) : 0);
  normalize_features(step, gather_features(step, features));
  plan_step(step, StepUse::kPredict);
  const int64_t offset = partition_.offset(comm_.rank());
  torch::Tensor best =
      torch::full({step.batch}, -std::numeric_limits<float>::infinity(), step.xn.options());
  torch::Tensor best_class = torch::zeros({step.batch}, step.xn.options().dtype(torch::kInt64));
  for (int64_t c = 0; c < step.plan.chunks; ++c) {
    const torch::Tensor rows = chunk_rows(step, step.chunk_begin(c), step.chunk_end(c));
    torch::Tensor dot = torch::empty({rows.size(0), step.batch}, step.xn.options());
    gemm_f32(dot, rows, false, step.xg, true, false);
    const auto [value, column] = dot.max(0);
    const torch::Tensor better = value.gt(best);
    best = torch::where(better, value, best);
    best_class = torch::where(better, column + (offset + step.chunk_begin(c)), best_class);
  }
  // The best score over all shards; among shards that reach it, the smallest class id.
  torch::Tensor global_best = best.clone();
  comm_.all_reduce(global_best, ReduceOp::kMax);
  torch::Tensor winner =
      torch::where(best.eq(global_best), best_class,
                   torch::full_like(best_class, std::numeric_limits<int64_t>::max()));
  comm_.all_reduce(winner, ReduceOp::kMin);
  return winner.slice(0, step.local_begin, step.local_begin + step.counts[comm_.rank()]);
}

}  // namespace myriad
