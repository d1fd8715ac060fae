#pragma once

#include <optional>
#include <string>
#include <vector>

#include "myriad/train/evaluation.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"

namespace myriad {

class ProcessContext;

struct TrainResult {
  bool stopped = false;  // by a signal or --stop-at-step, after a checkpoint
  int64_t steps = 0;
  std::optional<ClassificationEval> eval;  // the final evaluation, when --val-data is given
};

// Trains as `config` says: builds the data pipeline, the replicated backbone, the sharded
// classifier and the gradient synchronisation, runs the steps, logs (rank 0) and records
// metrics to RUN_DIR/metrics.jsonl, and evaluates every --eval-every steps and at the end.
// `config_ini` is the effective configuration, saved as RUN_DIR/config.ini. `observers` see every
// step's phases after the run's own (StepObserver). Collective.
TrainResult train(ProcessContext& context, const TrainConfig& config, const std::string& config_ini,
                  const std::vector<StepObserver*>& observers = {});

}  // namespace myriad
