#pragma once

#include "myriad/model/batch_norm.h"

namespace myriad::testing {

// Backward folds (use_backward_folds) on or off while it lives, then as they were, also where a
// failed assertion leaves the test early.
class BackwardFolds {
 public:
  explicit BackwardFolds(bool on) : before_(backward_folds_enabled()) { use_backward_folds(on); }
  ~BackwardFolds() { use_backward_folds(before_); }
  BackwardFolds(const BackwardFolds&) = delete;
  BackwardFolds& operator=(const BackwardFolds&) = delete;

 private:
  bool before_;
};

}  // namespace myriad::testing
