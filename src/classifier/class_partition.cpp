#include "myriad/classifier/class_partition.h"

#include "myriad/util/balanced_split.h"
#include "myriad/util/error.h"

namespace myriad {

ClassPartition::ClassPartition(int64_t num_classes, int world_size) : num_classes_(num_classes) {
  MYRIAD_CHECK_COLLECTIVE(num_classes > 0, "the number of classes must be positive, got {}",
                          num_classes);
  MYRIAD_CHECK_COLLECTIVE(num_classes >= world_size,
                          "{} classes cannot be split over {} ranks: every rank must own at least "
                          "one class",
                          num_classes, world_size);
  sizes_ = balanced_counts(num_classes, world_size);
  offsets_ = offsets_of(sizes_);
}

int ClassPartition::owner(int64_t label) const {
  MYRIAD_CHECK(label >= 0 && label < num_classes_, "label {} outside [0, {})", label, num_classes_);
  // The first C % W ranks own one class more than the rest.
  const int64_t base = num_classes_ / world_size();
  const int64_t big = num_classes_ % world_size();
  const int64_t in_big = big * (base + 1);
  if (label < in_big) return static_cast<int>(label / (base + 1));
  return static_cast<int>(big + (label - in_big) / base);
}

}  // namespace myriad
