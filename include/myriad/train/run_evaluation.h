#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "myriad/data/image_source.h"
#include "myriad/train/evaluation.h"
#include "myriad/train/step_observer.h"

namespace myriad {

class Backbone;
class MetricsLog;
class ShardedMarginSoftmax;

// The sets a run evaluates on: --val-data (classification) and each --eval-pairs set
// (verification), opened and checked at the start.
struct EvalSets {
  std::shared_ptr<const ImageSource> val;  // null without --val-data
  std::vector<std::pair<std::shared_ptr<const ImageSource>, std::vector<bool>>> pairs;
  bool empty() const { return !val && pairs.empty(); }
};

// A run's evaluations (docs/training.md, "Evaluation"): top-1 and kNN top-1 on the validation set
// and verification accuracy on each pairs set, logged by rank 0 and recorded as "eval" records of
// metrics.jsonl. Every --eval-every steps (before the last; the run evaluates at its end itself),
// collectively, with the backbone in eval mode meanwhile.
class RunEvaluation : public StepObserver {
 public:
  // `sets` outlive the evaluation.
  RunEvaluation(const EvalSets& sets, int64_t every, Backbone& backbone,
                ShardedMarginSoftmax& classifier, EvalSetup setup, MetricsLog& metrics);
  void step_finished(const StepEnd& e) override;
  // After `step` steps (collective); nothing without sets.
  void evaluate(int64_t step, int64_t epoch);
  // The last classification result, once one ran.
  const std::optional<ClassificationEval>& last() const { return last_; }

 private:
  const EvalSets& sets_;
  int64_t every_;
  Backbone& backbone_;
  ShardedMarginSoftmax& classifier_;
  EvalSetup setup_;
  MetricsLog& metrics_;
  std::optional<ClassificationEval> last_;
};

}  // namespace myriad
