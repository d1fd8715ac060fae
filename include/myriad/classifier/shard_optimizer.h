#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "myriad/classifier/row_gradient.h"

namespace myriad {

struct CpuRowUpdate;

enum class OptimizerKind { kSgd, kAdamW };
// "SGD" or "AdamW", for messages.
inline const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "SGD" : "AdamW";
}

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.1;
  double weight_decay = 5e-4;
  double momentum = 0.9;  // SGD
  bool nesterov = false;  // SGD
  double beta1 = 0.9;     // AdamW
  double beta2 = 0.999;   // AdamW
  double eps = 1e-8;      // AdamW
  // Momentum (SGD) or both moments (AdamW); bfloat16 halves the state's memory.
  torch::ScalarType state_dtype = torch::kFloat32;
};

// What SGD's row update on the GPU may write for the next forward as it stores the rows, at each
// row's place in the shard, bit for bit as that forward would make it: the rows' 1/|w| (a float32
// buffer of the shard's rows, as chunk_inv_norms measures them), and their copy ([shard rows, D]
// in the GEMM dtype, normalised where `normalize`, as prepare_chunk_rows makes it). Either may be
// left out.
struct NextForward {
  float* inv_norms = nullptr;
  torch::Tensor copy;
  bool normalize = false;
};

// The classifier shard's optimizer. Its updates are applied row by row as backward produces each
// chunk's gradient, fused with the backward of the row normalisation, so no gradient of the whole
// shard is ever stored. Semantics follow torch.optim.SGD (weight decay added to the gradient,
// dampening 0) and torch.optim.AdamW. Rows Partial FC did not sample keep their state untouched.
//
// The weights may be float32 or bfloat16. Updates are computed in float32 either way; bfloat16
// weights are stored with stochastic rounding, whose random bits depend on (seed, optimizer step,
// global class, column) only, so that any rank count trains the same weights.
class ShardOptimizer {
 public:
  // The shard holds `rows` classes from global class `first_row` on.
  ShardOptimizer(const OptimizerOptions& options, int64_t rows, int64_t dim,
                 const torch::Device& device, int64_t first_row, uint64_t seed);

  // Starts an optimisation step (AdamW's bias correction counts these).
  void begin_step();
  // Updates rows [begin, end) of the active rows (`index` lists shard rows; undefined means the
  // shard's own rows) of `weight` (float32 or bfloat16), given `grad` [end-begin, D] float32 (or
  // bfloat16, row_gradient_store), the gradient with respect to what `grad_of` says.
  // `grad_multiplier`, a float32 [1] on the weight's device read there (undefined: 1), undoes loss
  // scaling. SGD on the GPU also writes what `next` asks for; returns whether it did.
  bool update_rows(torch::Tensor& weight, const torch::Tensor& index, int64_t begin, int64_t end,
                   const torch::Tensor& grad, RowGradient grad_of,
                   const torch::Tensor& grad_multiplier, const NextForward& next = {});

  // Whether update_rows_from_logit_grad takes a global batch of `batch` rows of width `dim`,
  // stored as `weight_dtype`, on the GPU for optimizer `kind`: SGD, in a build with the fused
  // Hopper kernels (the caller runs them, so the GPU is an H100 or H200), with fused_sgd_rows'
  // shapes (bfloat16 rows). Static, so that a caller can refuse a run before allocating it.
  static bool updates_from_logit_grad(OptimizerKind kind, int64_t batch, int64_t dim,
                                      torch::ScalarType weight_dtype);
  // The features x [B, D] (bfloat16) as update_rows_from_logit_grad takes them: transposed, in
  // the fused kernel's order of columns, padded (fused_weight_update.h).
  torch::Tensor logit_grad_update_features(const torch::Tensor& x) const;
  // update_rows with grad = logit_grad . x, formed on the tensor cores and never stored:
  // `logit_grad` bfloat16 [end - begin, B] (d loss / d logits of the chunk's rows, as the fused
  // backward writes it) and `xt` the features as logit_grad_update_features gives them.
  void update_rows_from_logit_grad(torch::Tensor& weight, const torch::Tensor& index, int64_t begin,
                                   int64_t end, const torch::Tensor& logit_grad,
                                   const torch::Tensor& xt, RowGradient grad_of,
                                   const torch::Tensor& grad_multiplier);
  // update_rows on the CPU with each row's gradient logit_grad[i - begin] . features formed in
  // the row kernel and never stored: `logit_grad` float32 or bfloat16 [end - begin, B],
  // `features` float32 [B, D].
  void update_rows_from_product(torch::Tensor& weight, const torch::Tensor& index, int64_t begin,
                                int64_t end, const torch::Tensor& logit_grad,
                                const torch::Tensor& features, RowGradient grad_of,
                                const torch::Tensor& grad_multiplier);
  double lr() const { return options_.lr; }
  void set_lr(double lr) { options_.lr = lr; }
  const OptimizerOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  // The state tensors, by name, for checkpoints: SGD "momentum"; AdamW "exp_avg", "exp_avg_sq".
  std::vector<std::pair<std::string, torch::Tensor*>> state();

  // The seed of this step's stochastic rounding.
  uint64_t rounding_seed() const;

 private:
  OptimizerOptions options_;
  int64_t first_row_;
  uint64_t seed_;
  int64_t step_ = 0;
  torch::Tensor momentum_;
  torch::Tensor exp_avg_;
  torch::Tensor exp_avg_sq_;
  torch::Tensor column_order_;  // on the device, for logit_grad_update_features

  void update_rows_cpu(const CpuRowUpdate& rows, const torch::Tensor& grad_multiplier);
};

// Gradient with respect to rows w (float32) from the gradient `grad_of` says: for w / |w|,
// grad/|w| - (w . grad) w / |w|^3; for w / |w| divided by |w|, grad - (w . grad) w / |w|^2.
// Rows are independent.
torch::Tensor row_grad_of_rows(const torch::Tensor& rows, const torch::Tensor& grad,
                               RowGradient grad_of);

}  // namespace myriad
