#include "myriad/util/balanced_split.h"

#include "myriad/util/error.h"

namespace myriad {

std::vector<int64_t> balanced_counts(int64_t total, int parts) {
  MYRIAD_CHECK(parts > 0 && total >= 0, "cannot split {} items over {} parts", total, parts);
  std::vector<int64_t> counts(parts, total / parts);
  for (int r = 0; r < total % parts; ++r) ++counts[r];
  return counts;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size());
  int64_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = offset;
    offset += counts[r];
  }
  return offsets;
}

}  // namespace myriad
