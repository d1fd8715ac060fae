#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace myriad {

enum class OptimizerKind { kSgd, kAdamW };

// "sgd" or "adamw"; anything else is a UsageError.
OptimizerKind parse_optimizer_kind(const std::string& name);

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

// The classifier shard's optimizer. Its updates are applied row by row as backward produces each
// chunk's gradient, fused with the backward of the row normalisation, so no gradient of the whole
// shard is ever stored. Semantics follow torch.optim.SGD (weight decay added to the gradient,
// dampening 0) and torch.optim.AdamW. Rows Partial FC did not sample keep their state untouched.
class ShardOptimizer {
 public:
  ShardOptimizer(const OptimizerOptions& options, int64_t rows, int64_t dim,
                 const torch::Device& device);

  // Starts an optimisation step (AdamW's bias correction counts these).
  void begin_step();
  // Updates rows [begin, end) of the active rows (`index` lists shard rows; undefined means the
  // shard's own rows), given `grad` [end-begin, D]: the gradient with respect to the normalised
  // rows when `normalized`, else with respect to the rows. `grad_multiplier` undoes loss scaling.
  void update_rows(torch::Tensor& weight, const torch::Tensor& index, int64_t begin, int64_t end,
                   const torch::Tensor& grad, bool normalized, double grad_multiplier);

  double lr() const { return options_.lr; }
  void set_lr(double lr) { options_.lr = lr; }
  const OptimizerOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  // The state tensors, by name, for checkpoints: SGD "momentum"; AdamW "exp_avg", "exp_avg_sq".
  std::vector<std::pair<std::string, torch::Tensor*>> state();

 private:
  OptimizerOptions options_;
  int64_t step_ = 0;
  torch::Tensor momentum_;
  torch::Tensor exp_avg_;
  torch::Tensor exp_avg_sq_;
};

// Gradient with respect to rows w from the gradient with respect to w / |w|:
// grad/|w| - (w . grad) w / |w|^3. Rows are independent.
torch::Tensor unnormalize_row_grad(const torch::Tensor& rows, const torch::Tensor& grad);

}  // namespace myriad
