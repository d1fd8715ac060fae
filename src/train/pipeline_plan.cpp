#include "myriad/train/pipeline_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "myriad/comm/communicator.h"
#include "myriad/model/backbone.h"
#include "myriad/parallel/block_profile.h"
#include "myriad/parallel/pipeline_balance.h"
#include "myriad/train/graphs_choice.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// Every block's cost at one micro-batch, profiled by rank 0 and broadcast: one profile for all.
std::vector<BlockCost> block_costs(const TrainConfig& c, Backbone& backbone, Communicator& mpi,
                                   int rank, const torch::Device& device,
                                   std::optional<torch::ScalarType> autocast) {
  const int64_t blocks = backbone.num_blocks();
  const int64_t micro_batch = c.batch_size / c.micro_batches;
  torch::Tensor table = torch::zeros({blocks, 4}, torch::kFloat64);
  if (rank == 0) {
    torch::manual_seed(c.seed);
    const Activations sample{
        torch::randn({micro_batch, c.input.channels, c.input.height, c.input.width}),
        torch::arange(micro_batch, torch::kInt64), torch::Tensor()};
    const std::vector<BlockCost> costs =
        profile_blocks(backbone, sample, device, autocast, parameter_state_factor(c));
    for (int64_t b = 0; b < blocks; ++b) {
      table[b][0] = costs[b].device_seconds;
      table[b][1] = costs[b].launch_seconds;
      table[b][2] = costs[b].activation_bytes;
      table[b][3] = costs[b].state_bytes;
    }
  }
  mpi.broadcast(table, 0);
  std::vector<BlockCost> costs(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    costs[b] = {table[b][0].item<double>(), table[b][1].item<double>(), table[b][2].item<double>(),
                table[b][3].item<double>()};
  }
  return costs;
}

// What a stage may hold: --pipeline-memory, or 90% of the device's free memory less the
// classifier's workspace (no limit on the CPU); the least of any rank's, since every rank must
// take the same cut. The memory that rank 0's block profile left cached in the allocator is given
// back first: read as taken, it left rank 0 planning vit_h with 45.7 GiB of an H200, less than
// half of what an idle one leaves, and ranks that balance on different budgets can take different
// cuts.
double stage_memory(const TrainConfig& c, const torch::Device& device, Communicator& mpi) {
  double budget = std::numeric_limits<double>::infinity();
  if (c.pipeline_memory > 0) {
    budget = static_cast<double>(c.pipeline_memory);
  } else {
    release_cached_memory(device);
    const DeviceMemory memory = device_memory(device);
    if (memory.total > 0)
      budget = 0.9 * static_cast<double>(memory.free) - static_cast<double>(c.classifier_workspace);
  }
  torch::Tensor least = torch::full({1}, budget, torch::kFloat64);
  mpi.all_reduce(least, ReduceOp::kMin);
  return least.item<double>();
}

void log_plan(const TrainConfig& c, const Backbone& backbone, const std::vector<BlockCost>& costs,
              const std::vector<int64_t>& cut, const std::vector<double>& stage_bytes,
              const StagePrediction& predicted) {
  if (c.pipeline_profile) {
    for (int64_t b = 0; b < backbone.num_blocks(); ++b) {
      log_info(
          "block {} {}: forward+backward {:.2f} ms on the device (replayed), {:.2f} ms to launch, "
          "{} activations, {} state",
          b, backbone.block_name(b), 1e3 * costs[b].device_seconds, 1e3 * costs[b].launch_seconds,
          format_bytes(costs[b].activation_bytes), format_bytes(costs[b].state_bytes));
    }
  }
  const int stages = c.pipeline_stages;
  for (size_t k = 0; k + 1 < cut.size(); ++k) {
    const int chunk = static_cast<int>(k) / stages;
    log_info(
        "pipeline stage {}{}: blocks [{}, {}) ({} to {}), predicted {:.2f} ms per micro-batch "
        "eagerly (bound by {}), {:.2f} replayed as CUDA graphs, {}",
        static_cast<int>(k) % stages,
        cut.size() - 1 > static_cast<size_t>(stages) ? str_format(" chunk {}", chunk) : "", cut[k],
        cut[k + 1], backbone.block_name(cut[k]), backbone.block_name(cut[k + 1] - 1),
        predicted.eager_ms[k],
        predicted.eager_ms[k] > predicted.replay_ms[k] ? "the host's launches" : "the device",
        predicted.replay_ms[k], format_bytes(stage_bytes[k]));
  }
}

PipelineSchedule schedule_of(ScheduleChoice choice) {
  switch (choice) {
    case ScheduleChoice::k1F1B:
      return PipelineSchedule::k1F1B;
    case ScheduleChoice::kInterleaved:
      return PipelineSchedule::kInterleaved;
    default:
      return PipelineSchedule::kGPipe;
  }
}

// Each stage's time per micro-batch: the sum of its chunks' (virtual stages c P + s).
std::vector<double> stage_ms(const std::vector<double>& seconds, int stages) {
  std::vector<double> ms(static_cast<size_t>(stages), 0.0);
  for (size_t k = 0; k < seconds.size(); ++k) ms[k % stages] += 1e3 * seconds[k];
  return ms;
}

// What a search for a stage cut takes: the blocks' costs, the stages and their micro-batches,
// each (virtual) stage's memory, and whether it balances or checks the hand cut `given`.
struct CutSearch {
  const std::vector<BlockCost>& costs;
  int stages;
  int64_t micro_batches;
  int chunks;
  double memory;
  bool balance;
  std::vector<int64_t> given;
};

// A search's answer under `schedule`: its micro-batches in flight per stage, and the fastest cut
// that fits (the hand cut, if it fits), or none.
struct FittedCut {
  PipelineSchedule schedule;
  std::vector<int64_t> in_flight;
  std::optional<StageCut> cut;
};

FittedCut fit_cut(const CutSearch& s, PipelineSchedule schedule) {
  FittedCut f{schedule, micro_batches_in_flight(schedule, s.stages, s.micro_batches, s.chunks),
              std::nullopt};
  if (s.balance) {
    f.cut = balance_stages(s.costs, f.in_flight, s.memory);
    return f;
  }
  StageCut given = evaluate_cut(s.costs, s.given, f.in_flight);
  if (*std::max_element(given.stage_bytes.begin(), given.stage_bytes.end()) <= s.memory)
    f.cut = std::move(given);
  return f;
}

// auto: GPipe, unless only 1F1B's fewer micro-batches in flight fit (and if neither does, the
// answer under 1F1B, whose error says what it would need).
FittedCut choose_cut(const TrainConfig& c, const CutSearch& s, PipelineSchedule schedule) {
  FittedCut best = fit_cut(s, schedule);
  if (best.cut || c.pipeline_schedule != ScheduleChoice::kAuto || c.micro_batches <= 1) return best;
  best = fit_cut(s, PipelineSchedule::k1F1B);
  if (best.cut) {
    log_info(
        "pipeline schedule 1f1b (--pipeline-schedule auto): with the activations of all {} "
        "micro-batches held, as GPipe holds them, no cut fits in {} per GPU",
        c.micro_batches, format_bytes(s.memory));
  }
  return best;
}

}  // namespace

PipelinePlan plan_pipeline(const TrainConfig& c, Backbone& backbone, Communicator& mpi, int rank,
                           const torch::Device& device, std::optional<torch::ScalarType> autocast) {
  const int64_t blocks = backbone.num_blocks();
  const int stages = c.pipeline_stages;
  PipelinePlan plan;
  plan.schedule = schedule_of(c.pipeline_schedule);
  plan.chunks = plan.schedule == PipelineSchedule::kInterleaved ? c.virtual_stages : 1;
  const int chunks = plan.chunks;
  MYRIAD_CHECK_COLLECTIVE(
      blocks >= stages * chunks, "--pipeline-stages {}{}: backbone {} has only {} blocks to cut",
      stages, chunks > 1 ? str_format(" x --virtual-stages {}", chunks) : "", c.backbone, blocks);
  plan.cut = {0, blocks};
  if (!c.pipeline_split.empty())
    plan.cut = parse_pipeline_split(c.pipeline_split, stages, blocks, chunks);
  const bool profile = c.pipeline_profile || (stages > 1 && c.pipeline_split.empty());
  if (!profile) return plan;

  const std::vector<BlockCost> measured = block_costs(c, backbone, mpi, rank, device, autocast);
  const std::vector<BlockCost> replayed = replayed_costs(measured);
  // Interleaved, each of a stage's v chunks may take a v-th of its memory: a bound on their sum
  // that the balancer's cut into consecutive pieces can check piece by piece.
  const CutSearch search{cuda_graphs_expected(c, device) ? replayed : measured,
                         stages,
                         c.micro_batches,
                         chunks,
                         stage_memory(c, device, mpi) / chunks,
                         c.pipeline_split.empty() && stages > 1,
                         plan.cut};
  const FittedCut best = choose_cut(c, search, plan.schedule);
  plan.schedule = best.schedule;
  if (search.balance) {
    MYRIAD_CHECK_COLLECTIVE(
        best.cut.has_value(),
        "no cut of {}'s {} blocks into {} stages fits in {} per GPU, with the activations of {} "
        "micro-batches of {} samples held ({}): use more stages, a smaller --batch-size{}, or "
        "--activation-checkpointing",
        c.backbone, blocks, stages * chunks, format_bytes(search.memory * chunks),
        best.in_flight.front(), c.batch_size / c.micro_batches, schedule_name(plan.schedule),
        c.pipeline_schedule == ScheduleChoice::kGPipe && c.micro_batches > 1
            ? ", --pipeline-schedule 1f1b"
            : "");
    plan.cut = best.cut->cut;
  }
  const std::vector<int64_t>& in_flight = best.in_flight;
  // A cut's memory is the same under either cost: only its times differ.
  const StageCut eager = evaluate_cut(measured, plan.cut, in_flight);
  const StageCut replay = evaluate_cut(replayed, plan.cut, in_flight);
  log_plan(c, backbone, measured, plan.cut, eager.stage_bytes,
           {stage_ms(eager.stage_seconds, stages * chunks),
            stage_ms(replay.stage_seconds, stages * chunks)});
  plan.predicted = {stage_ms(eager.stage_seconds, stages), stage_ms(replay.stage_seconds, stages)};
  return plan;
}

}  // namespace myriad
