#pragma once

#include <cstdint>
#include <vector>

namespace myriad {

// Which rank owns which classes: the balanced split (util/balanced_split.h). Rank r owns the
// contiguous global range [offset(r), offset(r) + size(r)).
class ClassPartition {
 public:
  // C <= 0 or C < W is a collective error: every rank must own at least one class.
  ClassPartition(int64_t num_classes, int world_size);

  int64_t num_classes() const { return num_classes_; }
  int world_size() const { return static_cast<int>(sizes_.size()); }
  int64_t size(int rank) const { return sizes_.at(rank); }
  int64_t offset(int rank) const { return offsets_.at(rank); }
  const std::vector<int64_t>& sizes() const { return sizes_; }

  // The rank owning global class `label`, and its row in that rank's shard.
  int owner(int64_t label) const;
  int64_t local_index(int64_t label) const { return label - offsets_[owner(label)]; }

 private:
  int64_t num_classes_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> offsets_;
};

}  // namespace myriad
