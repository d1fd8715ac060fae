#include "myriad/parallel/pipeline_schedule.h"

#include <algorithm>

#include "myriad/util/error.h"

namespace myriad {

const char* schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::k1F1B ? "1f1b" : "gpipe";
}

std::vector<int64_t> micro_batches_in_flight(PipelineSchedule schedule, int stages,
                                             int micro_batches) {
  std::vector<int64_t> in_flight(static_cast<size_t>(stages), micro_batches);
  if (schedule == PipelineSchedule::k1F1B) {
    for (int s = 0; s < stages; ++s) in_flight[s] = std::min(stages - s, micro_batches);
  }
  return in_flight;
}

namespace {

// A stage's list, with the transfers its place in the pipeline calls for.
class ActionList {
 public:
  ActionList(int stages, int stage) : first_(stage == 0), last_(stage + 1 == stages) {}

  bool first() const { return first_; }
  bool last() const { return last_; }
  void add(ActionKind kind, int m, int received = -1) { actions_.push_back({kind, m, received}); }
  void recv_input(int m) {
    if (!first_) add(ActionKind::kRecvActivation, m);
  }
  void send_output(int m) {
    if (!last_) add(ActionKind::kSendActivation, m);
  }
  void send_input_grad(int m) {
    if (!first_) add(ActionKind::kSendGradient, m);
  }
  // Backward of m, as the step's last pass where it is.
  void backward(int m, bool last_pass) {
    if (last_pass) add(ActionKind::kAllReduce, m);
    add(ActionKind::kBackward, m);
  }
  std::vector<Action> take() { return std::move(actions_); }

 private:
  bool first_, last_;
  std::vector<Action> actions_;
};

// Every forward, each micro-batch sent on as soon as it is computed; the classifier once on the
// replica's batch; every backward, last micro-batch first.
std::vector<Action> gpipe(int stages, int stage, int m_count) {
  ActionList list(stages, stage);
  for (int m = 0; m < m_count; ++m) {
    list.recv_input(m);
    list.add(ActionKind::kForward, m);
    list.send_output(m);
  }
  list.add(ActionKind::kClassifier, kWholeBatch);
  for (int m = m_count - 1; m >= 0; --m) {
    if (!list.last()) list.add(ActionKind::kRecvGradient, m);
    list.backward(m, m == 0);
    list.send_input_grad(m);
  }
  return list.take();
}

// Megatron-LM's non-interleaved 1F1B: stage s runs w = min(P - s - 1, M) forwards ahead, then
// alternates one forward and one backward, then the w backwards left. The classifier of
// micro-batch m runs on every rank: on the last stage right after m's forward, and on the others
// (their share: no samples, their classes) right after the transfer that sends m's activations
// on. That is the earliest point at which every rank has passed m on, so every rank meets the
// parts and the pipeline's transfers in the same order, and it puts a share before the stage's
// next forward, not behind it: eager passes fill CUDA's launch queue, and a share queued after a
// forward left the host a whole pass behind the last stage, which waited for it.
std::vector<Action> one_f_one_b(int stages, int stage, int m_count) {
  ActionList list(stages, stage);
  const int warmup = std::min(stages - stage - 1, m_count);
  const int remaining = m_count - warmup;
  for (int m = 0; m < warmup; ++m) {
    list.recv_input(m);
    list.add(ActionKind::kForward, m);
    list.send_output(m);
    list.add(ActionKind::kClassifier, m);
  }
  if (remaining > 0) list.recv_input(warmup);
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i, b = i;
    list.add(ActionKind::kForward, f);
    if (list.last()) {
      list.add(ActionKind::kClassifier, b);
    } else {
      list.add(ActionKind::kSendActivationRecvGradient, f, b);
      list.add(ActionKind::kClassifier, f);
    }
    list.backward(b, b == m_count - 1);
    if (i + 1 == remaining) {
      list.send_input_grad(b);
    } else if (!list.first()) {
      list.add(ActionKind::kSendGradientRecvActivation, b, f + 1);
    }
  }
  for (int b = remaining; b < m_count; ++b) {
    list.add(ActionKind::kRecvGradient, b);
    list.backward(b, b == m_count - 1);
    list.send_input_grad(b);
  }
  return list.take();
}

}  // namespace

std::vector<Action> schedule_actions(PipelineSchedule schedule, int stages, int stage,
                                     int micro_batches) {
  MYRIAD_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
               "no schedule for stage {} of {} with {} micro-batches", stage, stages,
               micro_batches);
  return schedule == PipelineSchedule::k1F1B ? one_f_one_b(stages, stage, micro_batches)
                                             : gpipe(stages, stage, micro_batches);
}

std::string describe(const Action& a) {
  static const char* const kNames[] = {
      "F",         "B",         "recv-act",           "send-act",
      "recv-grad", "send-grad", "send-act/recv-grad", "send-grad/recv-act",
      "C",         "all-reduce"};
  static_assert(
      sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(ActionKind::kAllReduce) + 1,
      "a name for every action");
  std::string text = kNames[static_cast<int>(a.kind)];
  text +=
      a.micro_batch == kWholeBatch ? std::string(" whole") : " " + std::to_string(a.micro_batch);
  if (a.received >= 0) text += " <- " + std::to_string(a.received);
  return text;
}

}  // namespace myriad
