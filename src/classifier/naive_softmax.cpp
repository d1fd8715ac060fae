#include "myriad/classifier/naive_softmax.h"

#include <limits>

#include "myriad/classifier/mixed_gemm.h"
#include "myriad/comm/communicator.h"
#include "softmax_chunk.h"

namespace myriad {

NaiveShardedSoftmax::NaiveShardedSoftmax(Communicator& comm, const ShardedSoftmaxOptions& options,
                                         const torch::Device& device)
    : comm_(comm),
      options_(options),
      device_(device),
      partition_(options.num_classes, comm.size()) {
  const int64_t rows = partition_.size(comm.rank());
  const int64_t first = partition_.offset(comm.rank());
  weight_ = initial_shard(first, rows, options, device);
  optimizer_ = std::make_unique<ShardOptimizer>(options.optimizer, rows, options.embedding_size,
                                                device, first, options.seed);
}

torch::Tensor NaiveShardedSoftmax::step(const torch::Tensor& features,
                                        const torch::Tensor& labels) {
  torch::NoGradGuard no_grad;
  const MarginParams params = options_.margin.params();
  const int rank = comm_.rank();
  const std::vector<int64_t> counts = comm_.all_gather_counts(features.size(0));
  const torch::Tensor x = comm_.all_gather(features, counts).to(torch::kFloat32);
  const torch::Tensor y = comm_.all_gather(labels.to(torch::kInt64), counts);
  const int64_t batch = x.size(0);
  const torch::Tensor inv_norm = x.norm(2, 1, true).clamp_min(1e-12).reciprocal();
  const torch::Tensor xn = params.normalized ? x * inv_norm : x;
  const torch::Tensor xg = xn.to(options_.gemm_dtype).contiguous();
  const torch::Tensor rows = prepare_chunk_rows(weight_, torch::Tensor(), 0, weight_.size(0),
                                                options_.gemm_dtype, params.normalized);
  torch::Tensor cosine = torch::empty({weight_.size(0), batch}, xn.options());
  gemm_f32(cosine, rows, false, xg, true, false);

  // Rank 0 receives every shard's logits, [C, B], and computes the loss over all classes.
  const torch::Tensor logits = comm_.gather(cosine, partition_.sizes(), 0);
  torch::Tensor loss = torch::zeros({1}, xn.options());
  torch::Tensor logit_grad_all = torch::empty({0, batch}, xn.options().dtype(options_.gemm_dtype));
  if (rank == 0) {
    torch::Tensor row_max =
        torch::full({batch}, -std::numeric_limits<float>::infinity(), xn.options());
    torch::Tensor row_sum = torch::zeros({batch}, xn.options());
    torch::Tensor target = torch::zeros({batch}, xn.options());
    accumulate_chunk_stats(logits, torch::Tensor(), y, 0, params, row_max, row_sum, target);
    loss = (row_sum.log() + row_max - target).mean().reshape({1});
    const torch::Tensor coef = torch::full({1}, 1.0 / batch, xn.options());
    logit_grad_all = chunk_logit_grad(logits, torch::Tensor(), y, 0, row_max, row_sum.reciprocal(),
                                      coef, params, options_.gemm_dtype);
  }
  comm_.broadcast(loss, 0);
  const torch::Tensor logit_grad = comm_.scatter(logit_grad_all, partition_.sizes(), 0);

  torch::Tensor dxn = torch::zeros({batch, options_.embedding_size}, xn.options());
  gemm_f32_long_k(dxn, logit_grad, rows, true);
  torch::Tensor weight_grad = torch::empty(weight_.sizes(), xn.options());
  gemm_f32(weight_grad, logit_grad, false, xg, false, false);
  optimizer_->begin_step();
  optimizer_->update_rows(weight_, torch::Tensor(), 0, weight_.size(0), weight_grad,
                          params.normalized ? RowGradient::kUnitRow : RowGradient::kRow,
                          torch::Tensor());
  comm_.reduce_scatter(dxn, counts);
  return loss;
}

}  // namespace myriad
