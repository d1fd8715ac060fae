#pragma once

// The first of the classifier's two backward strategies: how a chunk's logits are formed, folded
// into the softmax statistics in forward, and turned into their gradient in backward. The module
// picks one in its constructor (make_logits_path) and never branches on it again.

#include <torch/types.h>

#include <memory>
#include <string>

#include "myriad/classifier/chunk_plan.h"
#include "myriad/classifier/margin.h"
#include "softmax_step.h"

namespace myriad {

class LogitsPath {
 public:
  virtual ~LogitsPath() = default;
  // For the start-up line and errors: "fused Hopper kernels, logits never in memory", ...
  virtual std::string describe() const = 0;
  virtual Logits logits() const = 0;
  // Whether forward may keep each logit's exponential for backward, where the plan caches.
  virtual bool keeps_exponentials() const = 0;
  // What forward keeps for backward under `plan`, where it caches, for the plan line.
  virtual std::string kept_for_backward(const ChunkPlan& plan) const = 0;
  // Folds the chunk [begin, end) whose GEMM operand is `rows` into `stats`, keeping in `step`
  // what its plan keeps for backward beyond the rows (the logits, or the exponentials).
  virtual void forward_chunk(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                             RowStatistics& stats) = 0;
  // Before backward's chunks: with kept exponentials, each sample's factor [B] that makes them the
  // logits' gradient (after their targets are replaced); else undefined.
  virtual torch::Tensor begin_backward(SoftmaxStep& step, const GradientScale& g) = 0;
  // Chunk c's d loss / d logits [rows, B] in the GEMM dtype, from its operand rows.
  virtual torch::Tensor logit_grad(SoftmaxStep& step, const torch::Tensor& rows, int64_t c,
                                   const GradientScale& g) = 0;
};

// The fused Hopper kernels where `fused`; else GEMMs with the softmax kernels (LibTorch operations
// on the CPU). `phases` outlives the path.
std::unique_ptr<LogitsPath> make_logits_path(bool fused, const MarginParams& params,
                                             torch::ScalarType gemm_dtype,
                                             const torch::Device& device, const PhaseMarks& phases);

}  // namespace myriad
