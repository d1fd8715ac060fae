#include "myriad/train/graphs_choice.h"

#include "myriad/comm/communicator.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/log.h"

namespace myriad {

bool cuda_graphs_possible(const TrainConfig& config, const torch::Device& device) {
  return device.is_cuda() && !config.sync_bn && !config.activation_checkpointing &&
         config.pipeline_schedule != ScheduleChoice::kInterleaved;
}

bool cuda_graphs_expected(const TrainConfig& config, const torch::Device& device) {
  return config.cuda_graphs == Toggle::kOn ||
         (config.cuda_graphs == Toggle::kAuto && cuda_graphs_possible(config, device));
}

GraphsChoice::GraphsChoice(Toggle mode, bool possible, PipelineEngine& engine, Communicator& mpi,
                           const torch::Device& device)
    : engine_(engine), mpi_(mpi), device_(device) {
  if (mode == Toggle::kOn) engine_.use_cuda_graphs(true);
  if (mode == Toggle::kAuto && possible) {
    phase_ = Phase::kFirst;
    log_info(
        "CUDA graphs (--cuda-graphs auto): {} eager steps, then {} replayed after the step that "
        "records them, decide whether they pay",
        kTrialSteps, kTrialSteps);
  }
}

std::string GraphsChoice::describe() const {
  if (phase_ != Phase::kFixed) return "CUDA graphs: auto";
  return engine_.cuda_graphs() ? "CUDA graphs" : "";
}

void GraphsChoice::step_started(const StepStart&) {
  if (phase_ == Phase::kRecord) engine_.use_cuda_graphs(true);
  if (phase_ == Phase::kEager || phase_ == Phase::kGraphs) {
    synchronize_device(device_);
    step_start_ = std::chrono::steady_clock::now();
  }
}

void GraphsChoice::step_finished(const StepEnd&) {
  const auto next = [this](Phase phase) {
    phase_ = phase;
    steps_in_phase_ = 0;
  };
  switch (phase_) {
    case Phase::kFixed:
      return;
    case Phase::kFirst:
      return next(Phase::kEager);
    case Phase::kRecord:
      // A recording that ran out of memory turned graphs off on every rank: that decides.
      if (!engine_.cuda_graphs()) return next(Phase::kFixed);
      return next(Phase::kGraphs);
    case Phase::kEager:
    case Phase::kGraphs:
      synchronize_device(device_);
      (phase_ == Phase::kEager ? eager_seconds_ : graph_seconds_) += seconds_since(step_start_);
      if (++steps_in_phase_ < kTrialSteps) return;
      if (phase_ == Phase::kEager) return next(Phase::kRecord);
      decide();
      return next(Phase::kFixed);
  }
}

void GraphsChoice::decide() {
  // The slowest rank's steps, in ms: every rank then takes the same decision.
  torch::Tensor ms =
      torch::tensor({eager_seconds_, graph_seconds_}, torch::kFloat64) * (1e3 / kTrialSteps);
  mpi_.all_reduce(ms, ReduceOp::kMax);
  const double eager = ms[0].item<double>(), graphs = ms[1].item<double>();
  const bool pay = graphs_pay(graphs, eager);
  if (!pay) engine_.use_cuda_graphs(false);
  log_info(
      "CUDA graphs (--cuda-graphs auto): {}: {:.1f} ms per step replayed against {:.1f} ms eager "
      "(the slowest rank's){}",
      pay ? "on" : "off", graphs, eager,
      pay ? ": the host's kernel launches cost more than the GPU's work"
          : ": they do not pay here, and their memory is given back");
}

}  // namespace myriad
