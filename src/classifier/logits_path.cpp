#include "logits_path.h"

#include "cpu_bf16_products.h"
#include "myriad/classifier/mixed_gemm.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// The fused Hopper kernels: logits formed in registers, in forward and again in backward, never
// in memory; where the plan caches the one chunk, forward keeps the exponentials.
class FusedLogits final : public LogitsPath {
 public:
  FusedLogits(const MarginParams& params, const PhaseMarks& phases)
      : params_(params), phases_(phases) {}

  std::string describe() const override { return "fused Hopper kernels, logits never in memory"; }
  Logits logits() const override { return Logits::kInRegisters; }
  bool keeps_exponentials() const override { return true; }
  std::string kept_for_backward(const ChunkPlan& plan) const override {
    return plan.kept_exponentials ? "exponentials kept for backward (bf16)"
                                  : "rows kept for backward";
  }

  void forward_chunk(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                     RowStatistics& stats) override {
    phases_("fused_logit_stats");
    if (step.plan.kept_exponentials) {
      step.kept.matrix = torch::empty({rows.size(0), step.batch}, step.xg.options());
      step.kept.target_cos = torch::empty({step.batch}, step.xn.options().dtype(torch::kFloat32));
    }
    accumulate_fused_chunk_stats(
        step.xg, rows, step.row_scale(c), step.target_col, step.chunk_begin(c), params_, stats.max,
        stats.sum, stats.target_logit, step.plan.kept_exponentials ? &step.kept : nullptr);
  }

  torch::Tensor begin_backward(SoftmaxStep& step, const GradientScale& g) override {
    if (!step.plan.kept_exponentials) return {};
    // dX̂ is scaled by the factor after its product, which is the product of one chunk alone.
    MYRIAD_CHECK(step.plan.chunks == 1, "the kept exponentials take one chunk, not {}",
                 step.plan.chunks);
    phases_("kept_logit_grad");
    return finish_kept_exponentials(step.kept, step.xg, step.cached_rows[0], step.row_scale(0),
                                    step.target_col, 0, step.row_max, step.row_inv_sum, g.coef,
                                    params_);
  }

  torch::Tensor logit_grad(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                           const GradientScale& g) override {
    if (step.plan.kept_exponentials) return std::move(step.kept.matrix);
    phases_("fused_logit_grad");
    return fused_chunk_logit_grad(step.xg, rows, step.row_scale(c), step.target_col,
                                  step.chunk_begin(c), step.row_max, step.row_inv_sum, g.coef,
                                  params_);
  }

 private:
  MarginParams params_;
  const PhaseMarks& phases_;
};

// A chunk's float32 logits [rows, B], written by a GEMM.
torch::Tensor gemm_logits(const SoftmaxStep& step, const torch::Tensor& rows,
                          const PhaseMarks& phases) {
  torch::Tensor dot =
      torch::empty({rows.size(0), step.batch}, step.xg.options().dtype(torch::kFloat32));
  phases("gemm_logits");
  gemm_f32(dot, rows, false, step.xg, true, false);
  return dot;
}

// Chunk c's logits' gradient from its logits `dot`.
torch::Tensor logit_grad_of(const torch::Tensor& dot, const SoftmaxStep& step, int64_t c,
                            const GradientScale& g, const MarginParams& params,
                            torch::ScalarType dtype, const PhaseMarks& phases) {
  phases("logit_grad");
  return chunk_logit_grad(dot, step.row_scale(c), step.target_col, step.chunk_begin(c),
                          step.row_max, step.row_inv_sum, g.coef, params, dtype);
}

// A GEMM writes each chunk's float32 logits and the softmax kernels read them; where the plan
// caches, forward keeps them, else backward multiplies again.
class GemmLogits final : public LogitsPath {
 public:
  GemmLogits(const MarginParams& params, torch::ScalarType gemm_dtype, const PhaseMarks& phases)
      : params_(params), gemm_dtype_(gemm_dtype), phases_(phases) {}

  std::string describe() const override { return "GEMMs and softmax kernels"; }
  Logits logits() const override { return Logits::kInMemory; }
  bool keeps_exponentials() const override { return false; }
  std::string kept_for_backward(const ChunkPlan&) const override { return "cached logits"; }

  void forward_chunk(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                     RowStatistics& stats) override {
    torch::Tensor dot = gemm_logits(step, rows, phases_);
    phases_("softmax_stats");
    accumulate_chunk_stats(dot, step.row_scale(c), step.target_col, step.chunk_begin(c), params_,
                           stats.max, stats.sum, stats.target_logit);
    if (step.plan.cache) step.cached_dot.push_back(std::move(dot));
  }

  torch::Tensor begin_backward(SoftmaxStep&, const GradientScale&) override { return {}; }

  torch::Tensor logit_grad(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                           const GradientScale& g) override {
    const torch::Tensor dot = step.plan.cache ? std::move(step.cached_dot[static_cast<size_t>(c)])
                                              : gemm_logits(step, rows, phases_);
    return logit_grad_of(dot, step, c, g, params_, gemm_dtype_, phases_);
  }

 private:
  MarginParams params_;
  torch::ScalarType gemm_dtype_;
  const PhaseMarks& phases_;
};

// The CPU's GEMMs (on bf16 pair products where the CPU has them) and softmax loops. Where the plan
// caches, forward keeps each logit's exponential instead of the logit, and backward turns them
// into the gradient in place: one pass of exponentials a step, not two.
class CpuLogits final : public LogitsPath {
 public:
  CpuLogits(const MarginParams& params, torch::ScalarType gemm_dtype, const PhaseMarks& phases)
      : params_(params), gemm_dtype_(gemm_dtype), phases_(phases) {}

  std::string describe() const override {
    return cpu_pair_products(gemm_dtype_)
               ? "GEMMs and softmax loops on the CPU (bf16 pair products)"
               : "GEMMs and softmax loops on the CPU";
  }
  Logits logits() const override { return Logits::kInMemory; }
  bool keeps_exponentials() const override { return false; }
  std::string kept_for_backward(const ChunkPlan&) const override {
    return "exponentials kept for backward (float32)";
  }

  void forward_chunk(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                     RowStatistics& stats) override {
    const torch::Tensor dot = gemm_logits(step, rows, phases_);
    phases_("softmax_stats");
    CpuKeptExponentials kept;
    if (step.plan.cache) kept.exps = torch::empty_like(dot);
    accumulate_chunk_stats(dot, step.row_scale(c), step.target_col, step.chunk_begin(c), params_,
                           stats.max, stats.sum, stats.target_logit,
                           step.plan.cache ? &kept : nullptr);
    if (step.plan.cache) step.cpu_kept.push_back(std::move(kept));
  }

  torch::Tensor begin_backward(SoftmaxStep&, const GradientScale&) override { return {}; }

  torch::Tensor logit_grad(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                           const GradientScale& g) override {
    if (step.plan.cache) {
      phases_("logit_grad");
      return cpu_kept_grad(step.cpu_kept[static_cast<size_t>(c)], params_, step.row_max,
                           step.row_inv_sum, g.coef.item<float>(), gemm_dtype_);
    }
    return logit_grad_of(gemm_logits(step, rows, phases_), step, c, g, params_, gemm_dtype_,
                         phases_);
  }

 private:
  MarginParams params_;
  torch::ScalarType gemm_dtype_;
  const PhaseMarks& phases_;
};

}  // namespace

std::unique_ptr<LogitsPath> make_logits_path(bool fused, const MarginParams& params,
                                             torch::ScalarType gemm_dtype,
                                             const torch::Device& device,
                                             const PhaseMarks& phases) {
  if (fused) return std::make_unique<FusedLogits>(params, phases);
  if (device.is_cuda()) return std::make_unique<GemmLogits>(params, gemm_dtype, phases);
  return std::make_unique<CpuLogits>(params, gemm_dtype, phases);
}

}  // namespace myriad
