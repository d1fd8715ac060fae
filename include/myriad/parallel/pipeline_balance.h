#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace myriad {

// What one block of a backbone costs a pipeline stage (measured by profile_blocks), for the
// forward + backward of one micro-batch.
struct BlockCost {
  // The device's own time: the block recorded as a CUDA graph and timed as replayed, as a stage
  // that replays graphs runs it (on the CPU, and where a block cannot be recorded, its time
  // launched from the host and waited for).
  double device_seconds = 0.0;
  // The host's time to launch the block eagerly, not waiting for the device; none for a replay.
  double launch_seconds = 0.0;
  double activation_bytes = 0.0;  // kept from forward to backward, per micro-batch in flight
  double state_bytes = 0.0;       // parameters, gradients and optimizer state
};

// A cut of the blocks into consecutive stages: stage s holds blocks [cut[s], cut[s + 1]).
struct StageCut {
  std::vector<int64_t> cut;
  std::vector<double> stage_seconds;  // per micro-batch
  std::vector<double> stage_bytes;    // state, plus activations of the micro-batches in flight
};

// The time of stage [begin, end) per micro-batch: the host launches the blocks while the device
// runs what was launched, so the slower of the two sets the pace (the sum of the blocks' device
// times, or of their launch times). Its memory with `in_flight` micro-batches' activations held.
double stage_seconds(const std::vector<BlockCost>& costs, int64_t begin, int64_t end);
double stage_bytes(const std::vector<BlockCost>& costs, int64_t begin, int64_t end,
                   int64_t in_flight);

// The contiguous cut into `in_flight.size()` non-empty stages that minimises the slowest stage's
// time, among the cuts whose every stage s fits in `memory_bytes` with in_flight[s] micro-batches
// of activations (dynamic programming over (stages, blocks): exact, O(P N^2)). Among cuts of the
// same slowest time, the smallest total of squared stage times wins, then the earliest cut. None
// when no cut fits.
std::optional<StageCut> balance_stages(const std::vector<BlockCost>& costs,
                                       const std::vector<int64_t>& in_flight, double memory_bytes);

// `costs` as stages that replay CUDA graphs meet them: the device's time alone, each graph being
// one launch.
std::vector<BlockCost> replayed_costs(std::vector<BlockCost> costs);

// `costs` with their launch times scaled to sum to `chain_seconds`, the host's time to launch
// every block one after another, where that is less: a block launched alone, behind a wait for
// the device, launches slower than inside a stage (r200 on an H200 host: 0.97 against 0.71 ms a
// block). A longer chain (its host stalled behind a full launch queue) changes nothing.
std::vector<BlockCost> chained_launches(std::vector<BlockCost> costs, double chain_seconds);

// The stage times and memory of a given cut (--pipeline-split, or for logging).
StageCut evaluate_cut(const std::vector<BlockCost>& costs, const std::vector<int64_t>& cut,
                      const std::vector<int64_t>& in_flight);

// "a,b,..." (--pipeline-split): the first block of (virtual) stages 1 ... P v - 1, as a cut of
// `blocks` into `stages` x `chunks`. A list that does not give every stage a block, in order, is a
// UsageError.
std::vector<int64_t> parse_pipeline_split(const std::string& text, int stages, int64_t blocks,
                                          int chunks = 1);

}  // namespace myriad
