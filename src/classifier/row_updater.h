#pragma once

// The second of the classifier's two backward strategies: what backward does with each chunk's
// logits' gradient for the rows. The module picks one in its constructor (make_row_updater):
//   - the optimizer's GPU row kernels (sgd_rows / adamw_rows) on the rows' gradient, which a GEMM
//     writes chunk by chunk, in pieces; with SGD they also write what the next forward would make
//     of the rows (the stored rows' 1/|w|, or the GEMMs' copy), and the updater owns those and
//     their validity;
//   - SGD's fused update (fused_sgd_rows), the rows' gradient never in memory, at the global
//     batches it takes, and the row kernels at the others;
//   - on the CPU, the optimizer's row loop, which forms each row's gradient from the logits'
//     gradient as it passes over the row;
//   - the rows' gradient accumulated into weight_grad() (WeightUpdate::kAccumulateGrad).
// A part of a step (the 1F1B pipeline) runs no updater: finish_parts runs it over every part.

#include <torch/types.h>

#include <memory>
#include <string>

#include "myriad/classifier/row_gradient.h"
#include "myriad/classifier/sharded_softmax.h"
#include "softmax_step.h"

namespace myriad {

class RowUpdater {
 public:
  virtual ~RowUpdater() = default;
  // For the start-up line: "SGD from the rows' bfloat16 gradient", ...
  virtual std::string describe() const = 0;
  // Where a step of global batch `batch` keeps the rows' gradient, for its chunk plan.
  virtual RowGradientStore gradient_store(int64_t batch) const = 0;
  // Starts the update of `step`, whose backward found the kept exponentials' `factor` (undefined
  // where the logits' gradient is formed whole).
  virtual void begin(const SoftmaxStep& step, const torch::Tensor& factor,
                     const GradientScale& g) = 0;
  // Updates chunk c's rows from its logits' gradient (the GEMM dtype, [rows, B]).
  virtual void update_chunk(const SoftmaxStep& step, int64_t c,
                            const torch::Tensor& logit_grad) = 0;
  virtual void finish(const SoftmaxStep& step) = 0;
  // The stored rows' 1/|w| [n_r] float32 as the last update wrote them, where they still describe
  // the weight; else undefined, and the next forward measures the rows.
  virtual torch::Tensor current_norms() const { return {}; }
  // The rows' copy for the GEMMs [n_r, D] (prepare_chunk_rows of every row) as the last update
  // wrote it, where it still describes the weight; else undefined, and forward makes its own.
  virtual torch::Tensor current_copy() const { return {}; }
};

// The updater for `options` (update, optimizer, fused update), where `fused_update` says that
// the fused update may run. `optimizer`, `weight`, `weight_grad` and `phases` outlive it.
std::unique_ptr<RowUpdater> make_row_updater(const ShardedSoftmaxOptions& options,
                                             bool fused_update, ShardOptimizer& optimizer,
                                             torch::Tensor& weight, torch::Tensor& weight_grad,
                                             const PhaseMarks& phases);

}  // namespace myriad
