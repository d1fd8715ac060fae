// The pipeline schedules as action lists (schedule_actions), checked on the lists alone: each
// stage's own rules, and every stage's list run together by a model of the transfers and
// collectives that finds wrong pairings and deadlocks. No GPUs, no MPI.

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "myriad/parallel/pipeline_schedule.h"

namespace myriad {
namespace {

using Lists = std::vector<std::vector<Action>>;

Lists all_stages(PipelineSchedule schedule, int stages, int m_count) {
  Lists lists;
  for (int s = 0; s < stages; ++s) lists.push_back(schedule_actions(schedule, stages, s, m_count));
  return lists;
}

// One half of a transfer: what goes to (or comes from) the neighbour at `peer`.
struct Half {
  bool send;
  bool activation;  // else a gradient
  int micro_batch;
  int peer;
};

std::vector<Half> halves(const Action& a, int stage) {
  const int prev = stage - 1, next = stage + 1, m = a.micro_batch;
  switch (a.kind) {
    case ActionKind::kRecvActivation:
      return {{false, true, m, prev}};
    case ActionKind::kSendActivation:
      return {{true, true, m, next}};
    case ActionKind::kRecvGradient:
      return {{false, false, m, next}};
    case ActionKind::kSendGradient:
      return {{true, false, m, prev}};
    case ActionKind::kSendActivationRecvGradient:
      return {{true, true, m, next}, {false, false, a.received, next}};
    case ActionKind::kSendGradientRecvActivation:
      return {{true, false, m, prev}, {false, true, a.received, prev}};
    default:
      return {};
  }
}

// Runs every stage's list as the ranks would: a transfer's halves each wait for the matching half
// of the neighbour's current action (the pair's traffic in each direction arrives in order, so
// the first unmatched halves must name the same micro-batch), a classifier part waits for every
// rank to reach it, and compute never waits. Returns what went wrong, or nothing.
std::optional<std::string> run_together(const Lists& lists) {
  const int stages = static_cast<int>(lists.size());
  std::vector<size_t> at(stages, 0);
  std::vector<std::vector<Half>> open(stages);
  const auto load = [&](int s) {
    open[s] = at[s] < lists[s].size() ? halves(lists[s][at[s]], s) : std::vector<Half>();
  };
  for (int s = 0; s < stages; ++s) load(s);
  for (;;) {
    bool moved = false;
    for (int s = 0; s + 1 < stages; ++s) {
      for (const bool activation : {true, false}) {
        // Activations go from s to s + 1, gradients from s + 1 to s.
        const int from = activation ? s : s + 1, to = activation ? s + 1 : s;
        auto out = std::find_if(open[from].begin(), open[from].end(), [&](const Half& h) {
          return h.send && h.activation == activation;
        });
        auto in = std::find_if(open[to].begin(), open[to].end(), [&](const Half& h) {
          return !h.send && h.activation == activation;
        });
        if (out == open[from].end() || in == open[to].end()) continue;
        if (out->micro_batch != in->micro_batch) {
          return "stage " + std::to_string(from) + " sends " +
                 (activation ? "activation " : "gradient ") + std::to_string(out->micro_batch) +
                 " where stage " + std::to_string(to) + " expects " +
                 std::to_string(in->micro_batch);
        }
        open[from].erase(out);
        open[to].erase(in);
        moved = true;
      }
    }
    // Actions with nothing left to match complete, except classifier parts.
    for (int s = 0; s < stages; ++s) {
      while (at[s] < lists[s].size() && open[s].empty() &&
             lists[s][at[s]].kind != ActionKind::kClassifier) {
        ++at[s];
        load(s);
        moved = true;
      }
    }
    const bool all_at_classifier = std::all_of(lists.begin(), lists.end(), [&](const auto& list) {
      const size_t i = at[&list - lists.data()];
      return i < list.size() && list[i].kind == ActionKind::kClassifier;
    });
    if (all_at_classifier) {
      const int part = lists[0][at[0]].micro_batch;
      for (int s = 0; s < stages; ++s) {
        if (lists[s][at[s]].micro_batch != part) {
          return "stage 0 runs classifier part " + std::to_string(part) + " where stage " +
                 std::to_string(s) + " runs part " + std::to_string(lists[s][at[s]].micro_batch);
        }
        ++at[s];
        load(s);
      }
      moved = true;
    }
    bool done = true;
    for (int s = 0; s < stages; ++s) done = done && at[s] == lists[s].size();
    if (done) return std::nullopt;
    if (!moved) {
      std::string stuck = "deadlock:";
      for (int s = 0; s < stages; ++s) {
        stuck += " stage " + std::to_string(s) + " at " +
                 (at[s] < lists[s].size() ? describe(lists[s][at[s]]) : std::string("its end")) +
                 ";";
      }
      return stuck;
    }
  }
}

// One stage's own rules: each micro-batch forwarded and backwarded once, in an order the data
// allows; no more at once than micro_batches_in_flight; one all-reduce, right before the last
// backward; transfers only with stages that exist.
std::optional<std::string> check_stage(const std::vector<Action>& list, int stages, int stage,
                                       int m_count, int64_t in_flight_bound) {
  const bool first = stage == 0, last = stage + 1 == stages;
  std::vector<int> forwarded(m_count, 0), backwarded(m_count, 0);
  std::vector<bool> input(m_count, first), grad(m_count, false), sent_out(m_count, false);
  int64_t in_flight = 0, all_reduces = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const int m = a.micro_batch;
    const std::string where = "action " + std::to_string(i) + " (" + describe(a) + ")";
    for (const Half& h : halves(a, stage)) {
      if (h.peer < 0 || h.peer >= stages) return where + " talks to a stage that does not exist";
      if (h.send && h.activation && forwarded[h.micro_batch] == 0)
        return where + " sends an output not computed yet";
      if (h.send && !h.activation && backwarded[h.micro_batch] == 0)
        return where + " sends an input gradient not computed yet";
      if (!h.send && h.activation) input[h.micro_batch] = true;
      if (!h.send && !h.activation) grad[h.micro_batch] = true;
      if (h.send && h.activation) sent_out[h.micro_batch] = true;
    }
    switch (a.kind) {
      case ActionKind::kForward:
        if (!input[m]) return where + " before its input arrived";
        if (++forwarded[m] > 1) return where + " forwards it twice";
        if (++in_flight > in_flight_bound)
          return where + " holds more than " + std::to_string(in_flight_bound) + " micro-batches";
        break;
      case ActionKind::kClassifier:
        if (last) {
          for (int k = 0; k < m_count; ++k) {
            if (m != kWholeBatch && k != m) continue;
            if (forwarded[k] == 0)
              return where + " before micro-batch " + std::to_string(k) + "'s forward";
            grad[k] = true;
          }
        }
        break;
      case ActionKind::kAllReduce:
        ++all_reduces;
        if (i + 1 >= list.size() || list[i + 1].kind != ActionKind::kBackward)
          return where + " is not followed by a backward";
        break;
      case ActionKind::kBackward:
        if (forwarded[m] == 0) return where + " before its forward";
        if (!grad[m]) return where + " before its output's gradient";
        if (++backwarded[m] > 1) return where + " backwards it twice";
        --in_flight;
        break;
      default:
        break;
    }
  }
  for (int m = 0; m < m_count; ++m) {
    if (forwarded[m] != 1 || backwarded[m] != 1)
      return "micro-batch " + std::to_string(m) + " is not forwarded and backwarded once";
    if (!last && !sent_out[m])
      return "micro-batch " + std::to_string(m) + "'s output is never sent";
  }
  if (all_reduces != 1) return std::to_string(all_reduces) + " all-reduces, not one";
  const auto last_backward = std::find_if(
      list.rbegin(), list.rend(), [](const Action& a) { return a.kind == ActionKind::kBackward; });
  if ((last_backward + 1)->kind != ActionKind::kAllReduce)
    return "the step's last backward does not all-reduce";
  return std::nullopt;
}

std::optional<std::string> check_schedule(PipelineSchedule schedule, const Lists& lists,
                                          int m_count) {
  const int stages = static_cast<int>(lists.size());
  const std::vector<int64_t> bound = micro_batches_in_flight(schedule, stages, m_count);
  for (int s = 0; s < stages; ++s) {
    if (auto error = check_stage(lists[s], stages, s, m_count, bound[s]))
      return "stage " + std::to_string(s) + ": " + *error;
  }
  return run_together(lists);
}

// The classifier parts each stage meets, in order.
std::vector<int> classifier_parts(const std::vector<Action>& list) {
  std::vector<int> parts;
  for (const Action& a : list)
    if (a.kind == ActionKind::kClassifier) parts.push_back(a.micro_batch);
  return parts;
}

TEST(PipelineSchedule, EveryScheduleRunsOnEveryStageCountAndMicroBatchCount) {
  for (const PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (const int stages : {1, 2, 3, 4, 8}) {
      for (int m_count = 1; m_count <= 24; ++m_count) {
        const std::string label = std::string(schedule_name(schedule)) +
                                  ", P = " + std::to_string(stages) +
                                  ", M = " + std::to_string(m_count);
        const Lists lists = all_stages(schedule, stages, m_count);
        const std::optional<std::string> error = check_schedule(schedule, lists, m_count);
        EXPECT_FALSE(error.has_value()) << label << ": " << error.value_or("");
        // GPipe runs the classifier once on the batch; 1F1B once per micro-batch, in order.
        std::vector<int> want{kWholeBatch};
        if (schedule == PipelineSchedule::k1F1B) {
          want.resize(static_cast<size_t>(m_count));
          for (int m = 0; m < m_count; ++m) want[m] = m;
        }
        for (int s = 0; s < stages; ++s)
          EXPECT_EQ(classifier_parts(lists[s]), want) << label << ", stage " << s;
      }
    }
  }
}

// 1F1B's point: stage s keeps at most P - s micro-batches, where GPipe keeps all M.
TEST(PipelineSchedule, OneFOneBHoldsFewerMicroBatchesThanGPipe) {
  const auto peak = [](const std::vector<Action>& list) {
    int64_t now = 0, most = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward) most = std::max(most, ++now);
      if (a.kind == ActionKind::kBackward) --now;
    }
    return most;
  };
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(peak(schedule_actions(PipelineSchedule::k1F1B, 4, s, 8)), 4 - s) << "stage " << s;
    EXPECT_EQ(peak(schedule_actions(PipelineSchedule::kGPipe, 4, s, 8)), 8) << "stage " << s;
  }
}

// Megatron-LM's 1F1B at P = 2, M = 3, as its paper draws it: the first stage runs one forward
// ahead, then one forward and one backward each, trading its activation for the gradient in one
// transfer; the last stage alternates from the start. Every rank runs part m of the classifier
// once m's activations have left it.
TEST(PipelineSchedule, OneFOneBIsMegatronsOrder) {
  const auto text = [](const std::vector<Action>& list) {
    std::vector<std::string> out;
    for (const Action& a : list) out.push_back(describe(a));
    return out;
  };
  EXPECT_EQ(text(schedule_actions(PipelineSchedule::k1F1B, 2, 0, 3)),
            (std::vector<std::string>{
                "F 0", "send-act 0", "C 0", "F 1", "send-act/recv-grad 1 <- 0", "C 1", "B 0", "F 2",
                "send-act/recv-grad 2 <- 1", "C 2", "B 1", "recv-grad 2", "all-reduce 2", "B 2"}));
  EXPECT_EQ(text(schedule_actions(PipelineSchedule::k1F1B, 2, 1, 3)),
            (std::vector<std::string>{
                "recv-act 0", "F 0", "C 0", "B 0", "send-grad/recv-act 0 <- 1", "F 1", "C 1", "B 1",
                "send-grad/recv-act 1 <- 2", "F 2", "C 2", "all-reduce 2", "B 2", "send-grad 2"}));
}

// The checks can fail: lists broken as a careless edit would break them are caught.
TEST(PipelineSchedule, BrokenListsAreCaught) {
  const int stages = 3, m_count = 5;
  const Lists good = all_stages(PipelineSchedule::k1F1B, stages, m_count);
  ASSERT_FALSE(check_schedule(PipelineSchedule::k1F1B, good, m_count).has_value());
  const auto swap_first = [&](int stage, ActionKind kind) {
    Lists lists = good;
    std::vector<Action>& list = lists[stage];
    std::vector<size_t> at;
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].kind == kind) at.push_back(i);
    std::swap(list[at[0]].micro_batch, list[at[1]].micro_batch);
    return lists;
  };
  // One stage meets two classifier parts in the other order than the rest.
  std::optional<std::string> error = run_together(swap_first(1, ActionKind::kClassifier));
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("classifier part"), std::string::npos) << *error;
  // The middle stage awaits micro-batch 1's input where micro-batch 0's arrives.
  Lists lists = good;
  for (Action& a : lists[1]) {
    if (a.kind == ActionKind::kRecvActivation && a.micro_batch == 0) a.micro_batch = 1;
  }
  error = run_together(lists);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("sends activation 0 where stage 1 expects 1"), std::string::npos) << *error;
  // A stage that receives a gradient before it sends the activation it belongs to deadlocks.
  lists = good;
  std::vector<Action>& first = lists[0];
  const auto send = std::find_if(first.begin(), first.end(), [](const Action& a) {
    return a.kind == ActionKind::kSendActivation;
  });
  first.insert(send, Action{ActionKind::kRecvGradient, 0});
  error = run_together(lists);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("deadlock"), std::string::npos) << *error;
  // An all-reduce on a backward that is not the step's last.
  lists = good;
  std::vector<Action>& last = lists[2];
  last.erase(std::find_if(last.begin(), last.end(),
                          [](const Action& a) { return a.kind == ActionKind::kAllReduce; }));
  last.insert(std::find_if(last.begin(), last.end(),
                           [](const Action& a) { return a.kind == ActionKind::kBackward; }),
              Action{ActionKind::kAllReduce, 0});
  error = check_stage(last, stages, 2, m_count, 1);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("last backward does not all-reduce"), std::string::npos) << *error;
}

}  // namespace
}  // namespace myriad
