#include "myriad/classifier/partial_fc.h"

#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

torch::Tensor sample_class_rows(const torch::Tensor& local_targets, int64_t shard_rows,
                                int64_t class_offset, double rate, uint64_t seed, int64_t step) {
  MYRIAD_CHECK(rate > 0.0 && rate <= 1.0, "sample rate must be in (0, 1], got {}", rate);
  const auto options = local_targets.options().dtype(torch::kInt64);
  const torch::Tensor classes = torch::arange(class_offset, class_offset + shard_rows, options);
  const uint64_t step_seed =
      mix64(seed ^ mix64(static_cast<uint64_t>(step) + 0x5851F42D4C957F2Dull));
  torch::Tensor keep = hash_uniform(classes, step_seed).lt_(rate);
  const torch::Tensor owned = local_targets.masked_select(local_targets.ge(0));
  keep.index_fill_(0, owned, true);
  return keep.nonzero().squeeze(1);
}

}  // namespace myriad
