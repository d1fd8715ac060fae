#include "row_updater.h"

#include <c10/util/intrusive_ptr.h>

#include <algorithm>

#include "cpu_bf16_products.h"
#include "myriad/classifier/mixed_gemm.h"
#include "myriad/util/device.h"
#include "myriad/util/format.h"

namespace myriad {

namespace {

// What the rows' gradient is taken with respect to: the GEMMs on a normalising margin's stored
// rows scale each class's logits by 1/|w| afterwards, which scales its gradient too.
RowGradient row_gradient_of_step(const SoftmaxStep& step, bool normalized) {
  if (!normalized) return RowGradient::kRow;
  return step.stored_rows ? RowGradient::kUnitRowOverNorm : RowGradient::kUnitRow;
}

// From kept exponentials the logits' gradient is kept[j, b] factor[b]: the rows' gradient takes
// the features times the factor, rounded to the GEMM dtype once, from float32.
torch::Tensor row_features(const SoftmaxStep& step, const torch::Tensor& factor,
                           torch::ScalarType gemm_dtype) {
  return factor.defined() ? (step.xn * factor.unsqueeze(1)).to(gemm_dtype) : step.xg;
}

// The updaters that form each chunk's rows' gradient with a GEMM, [rows, D] in `store`'s dtype.
class GemmRowUpdater : public RowUpdater {
 protected:
  GemmRowUpdater(const ShardedSoftmaxOptions& options, torch::Tensor& weight,
                 const PhaseMarks& phases)
      : options_(options), weight_(weight), phases_(phases) {}

  void begin_gradient(const SoftmaxStep& step, const torch::Tensor& factor) {
    features_ = row_features(step, factor, options_.gemm_dtype);
    grad_of_ = row_gradient_of_step(step, options_.margin.params().normalized);
    store_ = gradient_store(step.batch);
  }

  // The step's tensors are not kept beyond it.
  void end_gradient() { features_ = multiplier_ = torch::Tensor(); }

  // The rows' gradient of the logits' gradient `logit_grad` [rows, B]: [rows, D].
  torch::Tensor rows_gradient(const torch::Tensor& logit_grad) const {
    phases_("gemm_weight_grad");
    torch::Tensor grad = torch::empty({logit_grad.size(0), features_.size(1)},
                                      features_.options().dtype(row_gradient_dtype(store_)));
    gemm_f32(grad, logit_grad, false, features_, false, false);
    return grad;
  }

  const ShardedSoftmaxOptions& options_;
  torch::Tensor& weight_;
  const PhaseMarks& phases_;
  torch::Tensor features_;
  torch::Tensor multiplier_;  // the update's factor on the rows' gradient (GradientScale)
  RowGradient grad_of_ = RowGradient::kRow;
  RowGradientStore store_ = RowGradientStore::kFloat32;
};

// The optimizer's row kernels on each chunk's gradient, formed in pieces (row_gradient_piece_rows).
// SGD on the GPU, on every row of the shard (no Partial FC), also writes what the next forward
// would make of the rows as it stores them, bit for bit: each row's 1/|w| where forward reads it
// (the GEMMs on a normalising margin's stored rows; plain softmax's bound on its logits, by the
// largest |w|, where it keeps the exponentials), the GEMMs' copy where the plan takes it from the
// update (update_writes_copy). They stay current, from one step to the next, until the weight
// changes otherwise.
class OptimizerRowUpdater final : public GemmRowUpdater {
 public:
  OptimizerRowUpdater(const ShardedSoftmaxOptions& options, ShardOptimizer& optimizer,
                      torch::Tensor& weight, const PhaseMarks& phases)
      : GemmRowUpdater(options, weight, phases), optimizer_(optimizer) {}

  std::string describe() const override {
    return str_format("{} from the rows' {} gradient{}", optimizer_name(options_.optimizer.kind),
                      store_name(gradient_store(0)), next_forward_note());
  }
  RowGradientStore gradient_store(int64_t) const override {
    return row_gradient_store(options_.weight_dtype, options_.gemm_dtype, true);
  }

  void begin(const SoftmaxStep& step, const torch::Tensor& factor,
             const GradientScale& g) override {
    optimizer_.begin_step();
    void_from_update();
    begin_gradient(step, factor);
    multiplier_ = g.multiplier;
    next_ = next_forward(step);
    written_ = next_.inv_norms != nullptr || next_.copy.defined();
  }

  void update_chunk(const SoftmaxStep& step, int64_t c, const torch::Tensor& logit_grad) override {
    const int64_t begin = step.chunk_begin(c), rows = step.chunk_end(c) - begin;
    const int64_t piece =
        row_gradient_piece_rows(options_.workspace_bytes, features_.size(1), store_);
    for (int64_t first = 0; first < rows; first += piece) {
      const int64_t count = std::min(piece, rows - first);
      const torch::Tensor grad = rows_gradient(logit_grad.narrow(0, first, count));
      phases_("update");
      written_ = optimizer_.update_rows(weight_, step.active, begin + first, begin + first + count,
                                        grad, grad_of_, multiplier_, next_) &&
                 written_;
    }
  }

  void finish(const SoftmaxStep& step) override {
    end_gradient();
    next_ = NextForward();
    if (!written_ || step.plan.chunks == 0) return;
    from_update_.storage = weight_.storage().getWeakStorageImpl();
    from_update_.version = static_cast<int64_t>(weight_._version());
  }

  torch::Tensor current_norms() const override { return current(from_update_.inv_norms); }
  torch::Tensor current_copy() const override { return current(from_update_.copy); }

  // Every other write of the rows makes what the update wrote stale before it starts.
  void void_from_update() { from_update_.version = -1; }

 private:
  static const char* store_name(RowGradientStore store) {
    return store == RowGradientStore::kBFloat16 ? "bfloat16" : "float32";
  }

  // What SGD writes for the next forward as it stores the rows, for the start-up line: the rules
  // of next_forward, before any plan.
  std::string next_forward_note() const {
    const bool sampled = options_.sample_rate < 1.0;
    if (options_.optimizer.kind != OptimizerKind::kSgd || sampled) return "";
    const bool stored =
        row_source(options_.weight_dtype, options_.gemm_dtype, sampled) == RowSource::kStored;
    return str_format(", which writes {}the rows' 1/|w| where the next forward reads them",
                      stored ? std::string()
                             : str_format("the next forward's {} copy of the rows where a plan "
                                          "caches, and ",
                                          float_dtype_name(options_.gemm_dtype)));
  }

  // What this step's update may write for the next forward. A buffer that it may not write is
  // let go, so that none outlives its use.
  NextForward next_forward(const SoftmaxStep& step) {
    const MarginParams params = options_.margin.params();
    const bool sgd = weight_.is_cuda() && options_.optimizer.kind == OptimizerKind::kSgd;
    const bool sampled = step.active.defined();
    const bool norms =
        sgd && !sampled && (params.normalized ? step.stored_rows : step.plan.kept_exponentials);
    const RowSource source = step.stored_rows ? RowSource::kStored : RowSource::kCopy;
    const bool copy = sgd && update_writes_copy(source, sampled, step.plan.cache);
    FromUpdate& f = from_update_;
    f.inv_norms = norms ? reuse(f.inv_norms, {weight_.size(0)}, torch::kFloat32) : torch::Tensor();
    f.copy = copy ? reuse(f.copy, weight_.sizes(), options_.gemm_dtype) : torch::Tensor();
    return {norms ? f.inv_norms.data_ptr<float>() : nullptr, f.copy, params.normalized};
  }

  torch::Tensor reuse(const torch::Tensor& buffer, c10::IntArrayRef sizes,
                      torch::ScalarType dtype) const {
    if (buffer.defined() && buffer.sizes() == sizes && buffer.scalar_type() == dtype &&
        buffer.device() == weight_.device()) {
      return buffer;
    }
    return torch::empty(sizes, weight_.options().dtype(dtype));
  }

  torch::Tensor current(const torch::Tensor& written) const {
    const bool valid =
        written.defined() && from_update_.version >= 0 &&
        from_update_.version == static_cast<int64_t>(weight_._version()) &&
        from_update_.storage.lock().get() == weight_.storage().unsafeGetStorageImpl() &&
        written.size(0) == weight_.size(0);
    return valid ? written : torch::Tensor();
  }

  // What the update wrote, with the weight it describes: its storage (weakly held, so that a new
  // tensor at a freed one's address does not match) and version. A write through torch (a
  // checkpoint's load, copy_) moves the version; the update kernels write through raw pointers,
  // which do not.
  struct FromUpdate {
    torch::Tensor inv_norms;
    torch::Tensor copy;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    int64_t version = -1;
  };

  ShardOptimizer& optimizer_;
  NextForward next_;
  bool written_ = false;
  FromUpdate from_update_;
};

// SGD's update formed from the logits' gradient on the tensor cores, the rows' gradient never in
// memory, at the global batches it takes (fused_update_chosen); the row kernels at the others.
class FusedRowUpdater final : public RowUpdater {
 public:
  FusedRowUpdater(const ShardedSoftmaxOptions& options, ShardOptimizer& optimizer,
                  torch::Tensor& weight, const PhaseMarks& phases)
      : options_(options),
        optimizer_(optimizer),
        weight_(weight),
        phases_(phases),
        rows_(options, optimizer, weight, phases) {}

  std::string describe() const override {
    const std::string batches = options_.fused_update == FusedUpdate::kAuto
                                    ? str_format(" up to {}", kFusedUpdateAutoMaxBatch)
                                    : std::string();
    return str_format(
        "SGD, the rows' gradient never in memory (global batches of multiples of "
        "8{}), else {}",
        batches, rows_.describe());
  }
  RowGradientStore gradient_store(int64_t batch) const override {
    return takes(batch) ? RowGradientStore::kNone : rows_.gradient_store(batch);
  }

  void begin(const SoftmaxStep& step, const torch::Tensor& factor,
             const GradientScale& g) override {
    fused_ = takes(step.batch);
    if (!fused_) return rows_.begin(step, factor, g);
    optimizer_.begin_step();
    // The fused update writes neither norms nor copy: an earlier step's no longer describe the
    // rows.
    rows_.void_from_update();
    xt_ = optimizer_.logit_grad_update_features(row_features(step, factor, options_.gemm_dtype));
    grad_of_ = row_gradient_of_step(step, options_.margin.params().normalized);
    multiplier_ = g.multiplier;
  }

  void update_chunk(const SoftmaxStep& step, int64_t c, const torch::Tensor& logit_grad) override {
    if (!fused_) return rows_.update_chunk(step, c, logit_grad);
    phases_("fused_update");
    optimizer_.update_rows_from_logit_grad(weight_, step.active, step.chunk_begin(c),
                                           step.chunk_end(c), logit_grad, xt_, grad_of_,
                                           multiplier_);
  }

  void finish(const SoftmaxStep& step) override {
    if (!fused_) rows_.finish(step);
    xt_ = multiplier_ = torch::Tensor();
  }

  torch::Tensor current_norms() const override { return rows_.current_norms(); }
  torch::Tensor current_copy() const override { return rows_.current_copy(); }

 private:
  bool takes(int64_t batch) const {
    return fused_update_chosen(options_.fused_update, batch) &&
           ShardOptimizer::updates_from_logit_grad(options_.optimizer.kind, batch,
                                                   options_.embedding_size, options_.weight_dtype);
  }

  const ShardedSoftmaxOptions& options_;
  ShardOptimizer& optimizer_;
  torch::Tensor& weight_;
  const PhaseMarks& phases_;
  OptimizerRowUpdater rows_;
  bool fused_ = false;
  torch::Tensor xt_;
  RowGradient grad_of_ = RowGradient::kRow;
  torch::Tensor multiplier_;
};

// The optimizer's CPU row kernel, which forms each row's gradient from the chunk's logits'
// gradient and the features as it passes over the row: the rows' gradient never in memory. With
// bfloat16 GEMMs on a CPU that has bf16 pair products, the features stay bfloat16 and the kernel
// forms a block of rows' gradients by them; else they are widened to float32 once a step.
class CpuProductRowUpdater final : public RowUpdater {
 public:
  CpuProductRowUpdater(const ShardedSoftmaxOptions& options, ShardOptimizer& optimizer,
                       torch::Tensor& weight, const PhaseMarks& phases)
      : options_(options),
        optimizer_(optimizer),
        weight_(weight),
        phases_(phases),
        features_dtype_(cpu_pair_products(options.gemm_dtype) ? torch::kBFloat16
                                                              : torch::kFloat32) {}

  std::string describe() const override {
    return str_format("{}, each row's gradient formed in its update (CPU, {})",
                      optimizer_name(options_.optimizer.kind),
                      features_dtype_ == torch::kBFloat16 ? "bf16 pair products" : "float32");
  }
  RowGradientStore gradient_store(int64_t) const override { return RowGradientStore::kNone; }

  void begin(const SoftmaxStep& step, const torch::Tensor& factor,
             const GradientScale& g) override {
    optimizer_.begin_step();
    features_ = row_features(step, factor, options_.gemm_dtype).to(features_dtype_).contiguous();
    grad_of_ = row_gradient_of_step(step, options_.margin.params().normalized);
    multiplier_ = g.multiplier;
  }

  void update_chunk(const SoftmaxStep& step, int64_t c, const torch::Tensor& logit_grad) override {
    phases_("update");
    // The row loop reads float32 and bfloat16; float16 GEMMs' gradient is widened first.
    const torch::Tensor dz = logit_grad.scalar_type() == torch::kHalf
                                 ? logit_grad.to(torch::kFloat32)
                                 : logit_grad.contiguous();
    optimizer_.update_rows_from_product(weight_, step.active, step.chunk_begin(c),
                                        step.chunk_end(c), dz, features_, grad_of_, multiplier_);
  }

  void finish(const SoftmaxStep&) override { features_ = multiplier_ = torch::Tensor(); }

 private:
  const ShardedSoftmaxOptions& options_;
  ShardOptimizer& optimizer_;
  torch::Tensor& weight_;
  const PhaseMarks& phases_;
  const torch::ScalarType features_dtype_;
  torch::Tensor features_;
  RowGradient grad_of_ = RowGradient::kRow;
  torch::Tensor multiplier_;
};

// dL/dW accumulated into weight_grad() (checks and tests); the weights do not change.
class AccumulatingRowUpdater final : public GemmRowUpdater {
 public:
  AccumulatingRowUpdater(const ShardedSoftmaxOptions& options, torch::Tensor& weight,
                         torch::Tensor& weight_grad, const PhaseMarks& phases)
      : GemmRowUpdater(options, weight, phases), weight_grad_(weight_grad) {}

  std::string describe() const override { return "the rows' gradient accumulated, no update"; }
  RowGradientStore gradient_store(int64_t) const override {
    return row_gradient_store(options_.weight_dtype, options_.gemm_dtype, false);
  }

  void begin(const SoftmaxStep& step, const torch::Tensor& factor,
             const GradientScale& g) override {
    begin_gradient(step, factor);
    multiplier_ = g.rescale;
  }

  void update_chunk(const SoftmaxStep& step, int64_t c, const torch::Tensor& logit_grad) override {
    torch::Tensor grad = rows_gradient(logit_grad);
    phases_("update");
    const int64_t begin = step.chunk_begin(c), end = step.chunk_end(c);
    const torch::Tensor index =
        step.active.defined()
            ? step.active.slice(0, begin, end)
            : torch::arange(begin, end, torch::dtype(torch::kInt64).device(weight_.device()));
    const torch::Tensor w = weight_.index_select(0, index).to(torch::kFloat32);
    weight_grad_.index_add_(
        0, index,
        row_grad_of_rows(w, multiplier_.defined() ? grad.mul_(multiplier_) : grad, grad_of_));
  }

  void finish(const SoftmaxStep&) override { end_gradient(); }

 private:
  torch::Tensor& weight_grad_;
};

}  // namespace

std::unique_ptr<RowUpdater> make_row_updater(const ShardedSoftmaxOptions& options,
                                             bool fused_update, ShardOptimizer& optimizer,
                                             torch::Tensor& weight, torch::Tensor& weight_grad,
                                             const PhaseMarks& phases) {
  if (options.update == WeightUpdate::kAccumulateGrad) {
    return std::make_unique<AccumulatingRowUpdater>(options, weight, weight_grad, phases);
  }
  if (!weight.is_cuda())
    return std::make_unique<CpuProductRowUpdater>(options, optimizer, weight, phases);
  if (fused_update) return std::make_unique<FusedRowUpdater>(options, optimizer, weight, phases);
  return std::make_unique<OptimizerRowUpdater>(options, optimizer, weight, phases);
}

}  // namespace myriad
