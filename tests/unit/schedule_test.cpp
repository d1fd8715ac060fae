// The pipeline schedules as action lists (schedule_actions), checked on the lists alone: each
// stage's own rules, and every stage's list run together by a model of the transfers and
// collectives that finds wrong pairings and deadlocks. No GPUs, no MPI.

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "myriad/parallel/pipeline_schedule.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

using Lists = std::vector<std::vector<Action>>;

// A schedule's shape: P stages of v chunks (virtual stage c P + s is chunk c of stage s).
struct Shape {
  PipelineSchedule schedule;
  int stages;
  int m_count;
  int chunks = 1;
  int virtual_stages() const { return stages * chunks; }
  std::string label() const {
    return std::string(schedule_name(schedule)) + ", P = " + std::to_string(stages) +
           ", v = " + std::to_string(chunks) + ", M = " + std::to_string(m_count);
  }
};

Lists all_stages(const Shape& shape) {
  Lists lists;
  for (int s = 0; s < shape.stages; ++s)
    lists.push_back(schedule_actions(shape.schedule, shape.stages, s, shape.m_count, shape.chunks));
  return lists;
}

// One half of a transfer: what crosses `boundary`, from virtual stage `boundary` to the next
// (an activation) or back (a gradient), to or from the stage at `peer`.
struct Half {
  bool send;
  bool activation;  // else a gradient
  int chunk;        // this stage's chunk that sends or receives it
  int micro_batch;
  int boundary;
  int peer;
};

std::string item(bool activation, int chunk, int m) {
  return std::string(activation ? "activation " : "gradient ") +
         (chunk > 0 ? "c" + std::to_string(chunk) + ":" : "") + std::to_string(m);
}

std::vector<Half> halves(const Action& a, int stage, const Shape& shape) {
  const int p = shape.stages;
  const auto half = [&](bool send, bool activation, int chunk, int m) {
    const int k = chunk * p + stage;
    // What this stage's chunk sends forward, or receives back, crosses its output's boundary.
    const bool downstream = send == activation;
    const int boundary = downstream ? k : k - 1;
    const int peer = ((downstream ? k + 1 : k - 1) % p + p) % p;
    return Half{send, activation, chunk, m, boundary, peer};
  };
  const int m = a.micro_batch, c = a.chunk;
  switch (a.kind) {
    case ActionKind::kRecvActivation:
      return {half(false, true, c, m)};
    case ActionKind::kSendActivation:
      return {half(true, true, c, m)};
    case ActionKind::kRecvGradient:
      return {half(false, false, c, m)};
    case ActionKind::kSendGradient:
      return {half(true, false, c, m)};
    case ActionKind::kSendActivationRecvGradient:
      return {half(true, true, c, m), half(false, false, a.received_chunk, a.received)};
    case ActionKind::kSendGradientRecvActivation:
      return {half(true, false, c, m), half(false, true, a.received_chunk, a.received)};
    default:
      return {};
  }
}

// Runs every stage's list as the ranks would: a transfer's halves each wait for the matching half
// of the peer's current action (a pair's traffic each way arrives in order, so the first unmatched
// halves must carry the same thing across the same boundary), a classifier part waits for every
// rank to reach it, and compute never waits. Returns what went wrong, or nothing. With
// `makespan`, the step's time when a stage's forward costs 1 and its backward 2 (a chunk's, 1/v
// and 2/v), transfers nothing, and the classifier's parts run beside the stages' work (on GPUs,
// the stages before the last run them on a stream of their own), so that a part holds no rank
// back.
std::optional<std::string> run_together(const Lists& lists, const Shape& shape,
                                        double* makespan = nullptr) {
  const int stages = static_cast<int>(lists.size());
  std::vector<size_t> at(stages, 0);
  std::vector<std::vector<Half>> open(stages);
  std::vector<double> clock(stages, 0.0);
  const auto load = [&](int s) {
    open[s] = at[s] < lists[s].size() ? halves(lists[s][at[s]], s, shape) : std::vector<Half>();
  };
  for (int s = 0; s < stages; ++s) load(s);
  for (;;) {
    bool moved = false;
    for (int from = 0; from < stages; ++from) {
      for (int to = 0; to < stages; ++to) {
        auto out = std::find_if(open[from].begin(), open[from].end(),
                                [&](const Half& h) { return h.send && h.peer == to; });
        auto in = std::find_if(open[to].begin(), open[to].end(),
                               [&](const Half& h) { return !h.send && h.peer == from; });
        if (from == to || out == open[from].end() || in == open[to].end()) continue;
        if (out->activation != in->activation || out->boundary != in->boundary ||
            out->micro_batch != in->micro_batch) {
          return "stage " + std::to_string(from) + " sends " +
                 item(out->activation, out->chunk, out->micro_batch) + " where stage " +
                 std::to_string(to) + " expects " +
                 item(in->activation, in->chunk, in->micro_batch);
        }
        clock[from] = clock[to] = std::max(clock[from], clock[to]);
        open[from].erase(out);
        open[to].erase(in);
        moved = true;
      }
    }
    // Actions with nothing left to match complete, except classifier parts.
    for (int s = 0; s < stages; ++s) {
      while (at[s] < lists[s].size() && open[s].empty() &&
             lists[s][at[s]].kind != ActionKind::kClassifier) {
        const ActionKind kind = lists[s][at[s]].kind;
        if (kind == ActionKind::kForward) clock[s] += 1.0 / shape.chunks;
        if (kind == ActionKind::kBackward) clock[s] += 2.0 / shape.chunks;
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
    if (done) {
      if (makespan) *makespan = *std::max_element(clock.begin(), clock.end());
      return std::nullopt;
    }
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

// The most micro-batches stage s holds at once over all its chunks: under GPipe all M; under 1F1B
// P - s; interleaved, as Megatron-LM's interleaved schedule, the 2 (P - s - 1) + (v - 1) P
// forwards it runs ahead, plus one.
int64_t most_held(const Shape& shape, int s) {
  const int64_t all = static_cast<int64_t>(shape.m_count) * shape.chunks;
  switch (shape.schedule) {
    case PipelineSchedule::kGPipe:
      return all;
    case PipelineSchedule::k1F1B:
      return std::min<int64_t>(shape.stages - s, all);
    case PipelineSchedule::kInterleaved:
      return std::min<int64_t>(2 * (shape.stages - s - 1) + (shape.chunks - 1) * shape.stages + 1,
                               all);
  }
  return 0;
}

// One stage's own rules: each micro-batch forwarded and backwarded once through each chunk, in
// an order the data allows; no more at once than most_held, and per chunk what
// micro_batches_in_flight says; one all-reduce, right before the last backward; transfers only
// across boundaries that exist.
std::optional<std::string> check_stage(const std::vector<Action>& list, const Shape& shape,
                                       int stage) {
  const int m_count = shape.m_count, chunks = shape.chunks, p = shape.stages;
  const int last_virtual = shape.virtual_stages() - 1;
  const auto at = [m_count](int chunk, int m) { return static_cast<size_t>(chunk * m_count + m); };
  const size_t items = at(chunks, 0);
  std::vector<int> forwarded(items, 0), backwarded(items, 0);
  std::vector<bool> input(items, false), grad(items, false), sent_out(items, false);
  if (stage == 0)
    for (int m = 0; m < m_count; ++m) input[at(0, m)] = true;
  std::vector<int64_t> held(static_cast<size_t>(chunks), 0), peak(static_cast<size_t>(chunks), 0);
  int64_t in_flight = 0, all_reduces = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const int m = a.micro_batch;
    const std::string where = "action " + std::to_string(i) + " (" + describe(a) + ")";
    for (const Half& h : halves(a, stage, shape)) {
      if (h.boundary < 0 || h.boundary >= last_virtual)
        return where + " crosses a boundary that does not exist";
      const size_t x = at(h.chunk, h.micro_batch);
      if (h.send && h.activation && forwarded[x] == 0)
        return where + " sends an output not computed yet";
      if (h.send && !h.activation && backwarded[x] == 0)
        return where + " sends an input gradient not computed yet";
      if (!h.send && h.activation) input[x] = true;
      if (!h.send && !h.activation) grad[x] = true;
      if (h.send && h.activation) sent_out[x] = true;
    }
    switch (a.kind) {
      case ActionKind::kForward:
        if (!input[at(a.chunk, m)]) return where + " before its input arrived";
        if (++forwarded[at(a.chunk, m)] > 1) return where + " forwards it twice";
        if (++in_flight > most_held(shape, stage))
          return where + " holds more than " + std::to_string(most_held(shape, stage));
        peak[a.chunk] = std::max(peak[a.chunk], ++held[a.chunk]);
        break;
      case ActionKind::kClassifier:
        if (stage == p - 1) {
          for (int j = 0; j < m_count; ++j) {
            if (m != kWholeBatch && j != m) continue;
            if (forwarded[at(chunks - 1, j)] == 0)
              return where + " before micro-batch " + std::to_string(j) + "'s forward";
            grad[at(chunks - 1, j)] = true;
          }
        }
        break;
      case ActionKind::kAllReduce:
        ++all_reduces;
        if (i + 1 >= list.size() || list[i + 1].kind != ActionKind::kBackward)
          return where + " is not followed by a backward";
        break;
      case ActionKind::kBackward:
        if (forwarded[at(a.chunk, m)] == 0) return where + " before its forward";
        if (!grad[at(a.chunk, m)]) return where + " before its output's gradient";
        if (++backwarded[at(a.chunk, m)] > 1) return where + " backwards it twice";
        --in_flight;
        --held[a.chunk];
        break;
      default:
        break;
    }
  }
  const std::vector<int64_t> bound = micro_batches_in_flight(shape.schedule, p, m_count, chunks);
  for (int c = 0; c < chunks; ++c) {
    if (peak[c] != bound[static_cast<size_t>(c * p + stage)]) {
      return "chunk " + std::to_string(c) + " holds " + std::to_string(peak[c]) +
             " micro-batches, micro_batches_in_flight says " +
             std::to_string(bound[static_cast<size_t>(c * p + stage)]);
    }
    for (int m = 0; m < m_count; ++m) {
      if (forwarded[at(c, m)] != 1 || backwarded[at(c, m)] != 1)
        return "micro-batch " + std::to_string(m) + " is not forwarded and backwarded once";
      if (c * p + stage != last_virtual && !sent_out[at(c, m)])
        return "micro-batch " + std::to_string(m) + "'s output is never sent";
    }
  }
  if (all_reduces != 1) return std::to_string(all_reduces) + " all-reduces, not one";
  const auto last_backward = std::find_if(
      list.rbegin(), list.rend(), [](const Action& a) { return a.kind == ActionKind::kBackward; });
  if ((last_backward + 1)->kind != ActionKind::kAllReduce)
    return "the step's last backward does not all-reduce";
  return std::nullopt;
}

std::optional<std::string> check_schedule(const Shape& shape, const Lists& lists,
                                          double* makespan = nullptr) {
  for (int s = 0; s < shape.stages; ++s) {
    if (auto error = check_stage(lists[s], shape, s))
      return "stage " + std::to_string(s) + ": " + *error;
  }
  return run_together(lists, shape, makespan);
}

// The classifier parts each stage meets, in order.
std::vector<int> classifier_parts(const std::vector<Action>& list) {
  std::vector<int> parts;
  for (const Action& a : list)
    if (a.kind == ActionKind::kClassifier) parts.push_back(a.micro_batch);
  return parts;
}

TEST(PipelineSchedule, EveryScheduleRunsOnEveryStageCountAndMicroBatchCount) {
  std::vector<Shape> shapes;
  for (const int stages : {1, 2, 3, 4, 8}) {
    for (int m_count = 1; m_count <= 24; ++m_count) {
      shapes.push_back({PipelineSchedule::kGPipe, stages, m_count});
      shapes.push_back({PipelineSchedule::k1F1B, stages, m_count});
      // Megatron-LM's interleaved order runs the micro-batches in groups of P.
      for (const int chunks : {2, 3, 4}) {
        if (stages > 1 && m_count % stages == 0)
          shapes.push_back({PipelineSchedule::kInterleaved, stages, m_count, chunks});
      }
    }
  }
  for (const Shape& shape : shapes) {
    const Lists lists = all_stages(shape);
    const std::optional<std::string> error = check_schedule(shape, lists);
    EXPECT_FALSE(error.has_value()) << shape.label() << ": " << error.value_or("");
    // GPipe runs the classifier once on the batch; the others once per micro-batch, in order.
    std::vector<int> want{kWholeBatch};
    if (classifier_in_parts(shape.schedule)) {
      want.resize(static_cast<size_t>(shape.m_count));
      for (int m = 0; m < shape.m_count; ++m) want[m] = m;
    }
    for (int s = 0; s < shape.stages; ++s)
      EXPECT_EQ(classifier_parts(lists[s]), want) << shape.label() << ", stage " << s;
  }
}

// Interleaving's point: with v chunks a stage, the fill and drain of the pipeline cost 1/v of
// 1F1B's 3 (P - 1) stage-forwards, as Megatron-LM's paper derives, also when every transfer is a
// rendezvous that holds both ranks. Measured by run_together's clock, which knows nothing of the
// simulation that placed the transfers.
TEST(PipelineSchedule, InterleavingShrinksTheBubble) {
  const auto bubble = [](const Shape& shape) {
    double makespan = 0.0;
    const std::optional<std::string> error = check_schedule(shape, all_stages(shape), &makespan);
    EXPECT_FALSE(error.has_value()) << shape.label() << ": " << error.value_or("");
    return makespan - 3.0 * shape.m_count;
  };
  for (const int stages : {2, 4, 8}) {
    for (const int m_count : {stages, 2 * stages, 4 * stages}) {
      const double one_f_one_b = bubble({PipelineSchedule::k1F1B, stages, m_count});
      EXPECT_DOUBLE_EQ(one_f_one_b, 3.0 * (stages - 1));
      for (const int chunks : {2, 4}) {
        const Shape shape{PipelineSchedule::kInterleaved, stages, m_count, chunks};
        EXPECT_NEAR(bubble(shape), one_f_one_b / chunks, 1e-9) << shape.label();
      }
    }
  }
}

// Interleaved, the micro-batches run in groups of one per stage, and a stage holds two chunks or
// more: other shapes are refused, not run on a list that would stall.
TEST(PipelineSchedule, InterleavedRefusesShapesItCannotRun) {
  EXPECT_THROW(schedule_actions(PipelineSchedule::kInterleaved, 4, 0, 6, 2), Error);
  EXPECT_THROW(schedule_actions(PipelineSchedule::kInterleaved, 2, 0, 4, 1), Error);
  EXPECT_THROW(schedule_actions(PipelineSchedule::kInterleaved, 1, 0, 4, 2), Error);
  EXPECT_THROW(schedule_actions(PipelineSchedule::k1F1B, 2, 0, 4, 2), Error);
  EXPECT_NO_THROW(schedule_actions(PipelineSchedule::kInterleaved, 4, 3, 8, 2));
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
  const Shape shape{PipelineSchedule::k1F1B, 3, 5};
  const Lists good = all_stages(shape);
  ASSERT_FALSE(check_schedule(shape, good).has_value());
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
  std::optional<std::string> error = run_together(swap_first(1, ActionKind::kClassifier), shape);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("classifier part"), std::string::npos) << *error;
  // The middle stage awaits micro-batch 1's input where micro-batch 0's arrives.
  Lists lists = good;
  for (Action& a : lists[1]) {
    if (a.kind == ActionKind::kRecvActivation && a.micro_batch == 0) a.micro_batch = 1;
  }
  error = run_together(lists, shape);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("sends activation 0 where stage 1 expects activation 1"), std::string::npos)
      << *error;
  // A stage that receives a gradient before it sends the activation it belongs to deadlocks.
  lists = good;
  std::vector<Action>& first = lists[0];
  const auto send = std::find_if(first.begin(), first.end(), [](const Action& a) {
    return a.kind == ActionKind::kSendActivation;
  });
  first.insert(send, Action{ActionKind::kRecvGradient, 0});
  error = run_together(lists, shape);
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
  error = check_stage(last, shape, 2);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("last backward does not all-reduce"), std::string::npos) << *error;
}

// Interleaved, the wrap-around is checked as any transfer: the first stage taking the last
// stage's output into the wrong chunk, or a stage taking two chunks' passes out of order.
TEST(PipelineSchedule, BrokenInterleavedListsAreCaught) {
  const Shape shape{PipelineSchedule::kInterleaved, 2, 4, 2};
  const Lists good = all_stages(shape);
  ASSERT_FALSE(check_schedule(shape, good).has_value());
  // Stage 0 receives into chunk 0 (which takes the images) what stage 1 sends to its chunk 1.
  Lists lists = good;
  const auto wrapped = std::find_if(lists[0].begin(), lists[0].end(), [](const Action& a) {
    return a.kind == ActionKind::kSendGradientRecvActivation ||
           a.kind == ActionKind::kRecvActivation;
  });
  ASSERT_NE(wrapped, lists[0].end());
  (wrapped->kind == ActionKind::kRecvActivation ? wrapped->chunk : wrapped->received_chunk) = 0;
  std::optional<std::string> error = check_schedule(shape, lists);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("boundary that does not exist"), std::string::npos) << *error;
  // Stage 1 runs chunk 1's forward of micro-batch 0 before chunk 0's.
  lists = good;
  std::vector<Action>& second = lists[1];
  const auto forward = [&second](int chunk) {
    return std::find_if(second.begin(), second.end(), [chunk](const Action& a) {
      return a.kind == ActionKind::kForward && a.chunk == chunk && a.micro_batch == 0;
    });
  };
  std::swap(forward(0)->chunk, forward(1)->chunk);
  error = check_schedule(shape, lists);
  ASSERT_TRUE(error.has_value()) << "no error";
  EXPECT_NE(error->find("before its input arrived"), std::string::npos) << *error;
}

}  // namespace
}  // namespace myriad
