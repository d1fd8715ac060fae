#pragma once

// What one step of the sharded margin softmax carries from forward to backward, shared by the
// module (sharded_softmax.cpp) and its two backward strategies (logits_path.h, row_updater.h).

#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "myriad/classifier/chunk_plan.h"
#include "myriad/util/phase_timer.h"
#include "softmax_chunk.h"

namespace myriad {

// Everything forward computed that backward needs.
struct SoftmaxStep {
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
  torch::Tensor target_col;  // [B] row among the active rows, or -1
  torch::Tensor active;      // Partial FC's shard rows; undefined when all rows are active
  int64_t active_rows = 0;
  ChunkPlan plan;
  // The GEMMs read the stored rows themselves (see ShardedMarginSoftmax::chunk_rows), and
  // row_scales[c] holds chunk c's 1/|w| when the margin normalises.
  bool stored_rows = false;
  std::vector<torch::Tensor> row_scales;
  torch::Tensor row_max;      // [B] global max logit
  torch::Tensor row_inv_sum;  // [B] 1 / global sum of exp(z - max)
  std::vector<torch::Tensor> cached_dot;
  std::vector<CpuKeptExponentials> cpu_kept;  // on the CPU, in place of cached_dot
  std::vector<torch::Tensor> cached_rows;
  KeptExponentials kept;      // where the plan keeps the exponentials
  torch::Tensor finite_rows;  // [B] bool, a part's: whether each sample's features are finite

  int64_t chunk_begin(int64_t c) const { return c * plan.chunk_rows; }
  int64_t chunk_end(int64_t c) const {
    return std::min(chunk_begin(c) + plan.chunk_rows, active_rows);
  }
  // Chunk c's 1/|w| where the GEMMs read the stored rows of a normalising margin; else undefined.
  torch::Tensor row_scale(int64_t c) const {
    return row_scales.empty() ? torch::Tensor() : row_scales[static_cast<size_t>(c)];
  }
};

// Per sample over this shard's rows: the max logit, the sum of exp(logit - max) and the target
// logit (0 where another shard holds it), chunk by chunk.
struct RowStatistics {
  torch::Tensor max, sum, target_logit;
};

// How backward scales the logits' gradient: `coef` (the incoming gradient over the batch, capped
// for float16 GEMMs), `rescale` (what the cap took off; undefined: 1) and the update's factor on
// the rows' gradient (rescale and 1 / loss scale; undefined: 1).
struct GradientScale {
  torch::Tensor coef, rescale, multiplier;
};

// Marks the classifier's phases ("classifier.<name>") on the module's timer, where it has one.
class PhaseMarks {
 public:
  void set_timer(PhaseTimer* timer) { timer_ = timer; }
  void operator()(const char* name) const {
    if (timer_ != nullptr) timer_->mark(std::string("classifier.") + name);
  }

 private:
  PhaseTimer* timer_ = nullptr;
};

}  // namespace myriad
