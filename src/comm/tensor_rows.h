#pragma once

#include <torch/types.h>

namespace myriad {

// Elements in one dim-0 row; collectives that split by rows count in these.
inline int64_t row_numel(const torch::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

}  // namespace myriad
