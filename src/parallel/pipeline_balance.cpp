#include "myriad/parallel/pipeline_balance.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "myriad/util/error.h"

namespace myriad {

double stage_seconds(const std::vector<BlockCost>& costs, int64_t begin, int64_t end) {
  double device = 0.0, launch = 0.0;
  for (int64_t b = begin; b < end; ++b) {
    device += costs[b].device_seconds;
    launch += costs[b].launch_seconds;
  }
  return std::max(device, launch);
}

double stage_bytes(const std::vector<BlockCost>& costs, int64_t begin, int64_t end,
                   int64_t in_flight) {
  double bytes = 0.0;
  for (int64_t b = begin; b < end; ++b)
    bytes += costs[b].state_bytes + in_flight * costs[b].activation_bytes;
  return bytes;
}

std::vector<BlockCost> replayed_costs(std::vector<BlockCost> costs) {
  for (BlockCost& cost : costs) cost.launch_seconds = 0.0;
  return costs;
}

std::vector<BlockCost> chained_launches(std::vector<BlockCost> costs, double chain_seconds) {
  double sum = 0.0;
  for (const BlockCost& cost : costs) sum += cost.launch_seconds;
  if (!(chain_seconds > 0.0) || chain_seconds >= sum) return costs;
  const double factor = chain_seconds / sum;
  for (BlockCost& cost : costs) cost.launch_seconds *= factor;
  return costs;
}

StageCut evaluate_cut(const std::vector<BlockCost>& costs, const std::vector<int64_t>& cut,
                      const std::vector<int64_t>& in_flight) {
  StageCut out;
  out.cut = cut;
  for (size_t s = 0; s + 1 < cut.size(); ++s) {
    out.stage_seconds.push_back(stage_seconds(costs, cut[s], cut[s + 1]));
    out.stage_bytes.push_back(stage_bytes(costs, cut[s], cut[s + 1], in_flight[s]));
  }
  return out;
}

std::optional<StageCut> balance_stages(const std::vector<BlockCost>& costs,
                                       const std::vector<int64_t>& in_flight, double memory_bytes) {
  const int64_t n = static_cast<int64_t>(costs.size());
  const int64_t p = static_cast<int64_t>(in_flight.size());
  MYRIAD_CHECK(p >= 1 && n >= p, "{} blocks cannot be cut into {} stages", n, p);
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // best[s][j]: the (slowest, sum of squares) of stages 0..s-1 holding blocks [0, j); from[s][j]
  // the first block of stage s-1 in that cut.
  struct Value {
    double slowest = kNone;
    double squares = kNone;
    bool operator<(const Value& o) const {
      return slowest < o.slowest || (slowest == o.slowest && squares < o.squares);
    }
  };
  std::vector<std::vector<Value>> best(p + 1, std::vector<Value>(n + 1));
  std::vector<std::vector<int64_t>> from(p + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = {0.0, 0.0};
  for (int64_t s = 1; s <= p; ++s) {
    for (int64_t j = s; j <= n - (p - s); ++j) {
      for (int64_t i = s - 1; i < j; ++i) {
        if (best[s - 1][i].slowest == kNone) continue;
        if (stage_bytes(costs, i, j, in_flight[s - 1]) > memory_bytes) continue;
        const double t = stage_seconds(costs, i, j);
        const Value v{std::max(best[s - 1][i].slowest, t), best[s - 1][i].squares + t * t};
        if (v < best[s][j]) {
          best[s][j] = v;
          from[s][j] = i;
        }
      }
    }
  }
  if (best[p][n].slowest == kNone) return std::nullopt;
  std::vector<int64_t> cut(p + 1);
  cut[p] = n;
  for (int64_t s = p; s > 0; --s) cut[s - 1] = from[s][cut[s]];
  return evaluate_cut(costs, cut, in_flight);
}

std::vector<int64_t> parse_pipeline_split(const std::string& text, int stages, int64_t blocks,
                                          int chunks) {
  std::vector<int64_t> cut = {0};
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      cut.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError(
          str_format("--pipeline-split must be a comma list of block numbers, got '{}'", text));
    }
  }
  cut.push_back(blocks);
  const int wanted = stages * chunks;
  if (static_cast<int>(cut.size()) != wanted + 1) {
    const std::string run = chunks == 1
                                ? str_format("--pipeline-stages is {}", stages)
                                : str_format("--pipeline-stages {} x --virtual-stages {} is {}",
                                             stages, chunks, wanted);
    throw UsageError(str_format(
        "--pipeline-split '{}' gives {} stages, {}: it lists the first block of every stage but "
        "the first, {} number(s)",
        text, cut.size() - 1, run, wanted - 1));
  }
  for (size_t s = 0; s + 1 < cut.size(); ++s) {
    if (cut[s] >= cut[s + 1]) {
      throw UsageError(str_format(
          "--pipeline-split '{}' gives stage {} no block: the first blocks of the stages must "
          "increase, within the backbone's {} blocks",
          text, s, blocks));
    }
  }
  return cut;
}

}  // namespace myriad
