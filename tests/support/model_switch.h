#pragma once

#include "myriad/model/batch_norm.h"

namespace myriad::testing {

// One of the model's process-wide switches (use_backward_folds, use_convolution_statistics) set
// while this lives, then to `after`, also where a failed assertion leaves the test early.
class ModelSwitch {
 public:
  ModelSwitch(bool (*use)(bool), bool on, bool after) : use_(use), after_(after) { use_(on); }
  ~ModelSwitch() { use_(after_); }
  ModelSwitch(const ModelSwitch&) = delete;
  ModelSwitch& operator=(const ModelSwitch&) = delete;

 private:
  bool (*use_)(bool);
  bool after_;
};

// Backward folds as asked, then as they were.
inline ModelSwitch backward_folds(bool on) {
  return {use_backward_folds, on, backward_folds_enabled()};
}

// Batch norm's statistics from cuDNN's convolutions, then the process's default (off).
inline ModelSwitch convolution_statistics_on() {
  return {use_convolution_statistics, true, false};
}

}  // namespace myriad::testing
