#pragma once

#include <cstdint>
#include <vector>

namespace myriad {

// The balanced split of `total` items over `parts` ranks: part r gets total/parts items, plus one
// when r < total % parts, in rank order. Classes over ranks, rows of a batch over ranks.
std::vector<int64_t> balanced_counts(int64_t total, int parts);

// Where each part starts: the running sums of `counts`, from 0.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);

}  // namespace myriad
