#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace myriad {

// The phases of a training step that the run's observers see, in the order they come. Each event
// says what is known at its phase.
struct RunStart {
  int64_t first_step = 0;  // 0-based: after a resume, the first step this process takes
  int64_t total_steps = 0;
};
struct StepStart {
  int64_t step = 0;  // 0-based
};
// The batch is loaded and the step's own work begins.
struct BatchReady {
  int64_t step = 0;
  double data_wait_seconds = 0.0;  // the step's wait for its batch
};
// Before each backward pass through the classifier (once per step, or per micro-batch with 1F1B):
// the classifier's rows are updated from here on.
struct BeforeBackward {
  int64_t step = 0;
};
// After the optimizer: the step is done on this rank.
struct StepEnd {
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t epoch = 0;
  const torch::Tensor& loss;  // on the last pipeline stage; undefined on the others
  double lr = 0.0;            // the backbone's
};

// What watches or orders a training step (CUDA graphs' choice, the profiler, the straggler report,
// asynchronous checkpoints, the progress report, evaluation). Each phase has its own event type;
// an observer overrides the phases it needs. Phases that a collaborator makes collective must be
// met by every rank, and are: every rank runs the same steps.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void run_started(const RunStart&) {}
  virtual void step_started(const StepStart&) {}
  virtual void batch_ready(const BatchReady&) {}
  virtual void before_backward(const BeforeBackward&) {}
  virtual void step_finished(const StepEnd&) {}
};

// The run's observers, told of each phase in the order they were added (which is the order of
// their collectives on every rank).
class StepObservers {
 public:
  StepObservers() = default;
  StepObservers(std::initializer_list<StepObserver*> observers) : observers_(observers) {}
  void add(StepObserver& observer) { observers_.push_back(&observer); }

  void run_started(const RunStart& e) const { tell(&StepObserver::run_started, e); }
  void step_started(const StepStart& e) const { tell(&StepObserver::step_started, e); }
  void batch_ready(const BatchReady& e) const { tell(&StepObserver::batch_ready, e); }
  void before_backward(const BeforeBackward& e) const { tell(&StepObserver::before_backward, e); }
  void step_finished(const StepEnd& e) const { tell(&StepObserver::step_finished, e); }

 private:
  template <typename Event>
  void tell(void (StepObserver::*phase)(const Event&), const Event& e) const {
    for (StepObserver* observer : observers_) (observer->*phase)(e);
  }
  std::vector<StepObserver*> observers_;
};

}  // namespace myriad
