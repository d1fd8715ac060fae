#include "myriad/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "myriad/util/error.h"

namespace myriad {

const char* schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  MYRIAD_THROW("no PipelineSchedule {}", static_cast<int>(schedule));
}

bool classifier_in_parts(PipelineSchedule schedule) {
  return schedule != PipelineSchedule::kGPipe;
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

// Interleaved 1F1B. Each rank runs Megatron-LM's order of its chunks' passes: the micro-batches in
// groups of P, each group forwarded through chunk 0, then chunk 1, ..., and backwarded from the
// last chunk down; 2 (P - s - 1) + (v - 1) P forwards ahead, then one forward and one backward
// each. Where the transfers and classifier parts go among them is read off a simulation of all
// ranks with unit costs (a forward 1, a backward 2) that holds transfers as rendezvous (plan_pass),
// a part going where the last virtual stage's forward ends. Every rank's list is thus the same
// global order of events seen from that rank, which no rank can deadlock on.
class InterleavedPlan {
 public:
  InterleavedPlan(int stages, int chunks, int m_count)
      : p_(stages),
        v_(chunks),
        m_(m_count),
        lists_(static_cast<size_t>(stages)),
        busy_(static_cast<size_t>(stages)),
        meetings_(static_cast<size_t>(stages)) {
    simulate();
    for (int s = 0; s < p_; ++s) {
      merge_exchanges(s);
      mark_last_pass(s);
    }
  }
  std::vector<Action> take(int stage) { return actions(stage); }

 private:
  struct Work {
    bool forward;
    int chunk;
    int m;
  };
  // An event's place in the global order: its time, then transfers before parts before passes.
  using Key = std::tuple<int64_t, int, int64_t>;
  struct Entry {
    Key key;
    Action action;
    int peer = -1;  // a transfer's other rank
  };
  // A pass as planned: its start, and the rank it receives from (-1: none) at `meeting`.
  struct Pass {
    int64_t start = 0;
    int from = -1;
    int64_t meeting = 0;
  };

  int next(int s) const { return (s + 1) % p_; }
  int previous(int s) const { return (s + p_ - 1) % p_; }
  size_t slot(int virtual_stage, int m) const {
    return static_cast<size_t>(virtual_stage * m_ + m);
  }

  std::vector<Work> order(int s) const {
    std::vector<Work> forwards, backwards;
    for (int g = 0; g < m_; g += p_) {
      const int end = std::min(g + p_, m_);
      for (int c = 0; c < v_; ++c)
        for (int m = g; m < end; ++m) forwards.push_back({true, c, m});
      for (int c = v_ - 1; c >= 0; --c)
        for (int m = g; m < end; ++m) backwards.push_back({false, c, m});
    }
    const int total = m_ * v_;
    const int warmup = std::min(total, 2 * (p_ - s - 1) + (v_ - 1) * p_);
    std::vector<Work> out(forwards.begin(), forwards.begin() + warmup);
    for (int i = warmup; i < total; ++i) {
      out.push_back(forwards[static_cast<size_t>(i)]);
      out.push_back(backwards[static_cast<size_t>(i - warmup)]);
    }
    out.insert(out.end(), backwards.end() - warmup, backwards.end());
    return out;
  }

  void add(int s, Key key, Action action, int peer = -1) {
    lists_[static_cast<size_t>(s)].push_back({key, action, peer});
  }

  void simulate();
  bool inside_pass(int s, int64_t time) const;
  Pass plan_pass(int s, const Work& w, int64_t ready) const;
  void run(int s, const Work& w, const Pass& pass, std::vector<int64_t>& inputs,
           std::vector<int64_t>& grads);
  void merge_exchanges(int s);
  void mark_last_pass(int s);
  std::vector<Action> actions(int s) const;

  int p_, v_, m_;
  int64_t events_ = 0;
  std::vector<std::vector<Entry>> lists_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> busy_;  // each rank's passes
  std::vector<std::vector<int64_t>> meetings_;                  // ... and transfers' times
};

void InterleavedPlan::simulate() {
  const int virtual_stages = p_ * v_;
  // When each virtual stage's input of micro-batch m, and its output's gradient, are ready (-1:
  // not yet computed).
  std::vector<int64_t> inputs(slot(virtual_stages, 0), -1), grads(slot(virtual_stages, 0), -1);
  for (int m = 0; m < m_; ++m) inputs[slot(0, m)] = 0;
  std::vector<std::vector<Work>> orders;
  for (int s = 0; s < p_; ++s) orders.push_back(order(s));
  std::vector<size_t> at(static_cast<size_t>(p_), 0);
  for (;;) {
    int best = -1;
    Pass best_pass;
    for (int s = 0; s < p_; ++s) {
      if (at[s] == orders[s].size()) continue;
      const Work& w = orders[s][at[s]];
      const int k = w.chunk * p_ + s;
      const int64_t ready = (w.forward ? inputs : grads)[slot(k, w.m)];
      if (ready < 0) continue;
      const Pass pass = plan_pass(s, w, ready);
      if (best < 0 || pass.start < best_pass.start) best = s, best_pass = pass;
    }
    if (best < 0) break;
    run(best, orders[best][at[best]++], best_pass, inputs, grads);
  }
  for (int s = 0; s < p_; ++s) {
    MYRIAD_CHECK(at[s] == orders[s].size(),
                 "the interleaved schedule of {} stages, {} chunks and {} micro-batches stalls", p_,
                 v_, m_);
    std::sort(lists_[s].begin(), lists_[s].end(),
              [](const Entry& a, const Entry& b) { return a.key < b.key; });
  }
}

bool InterleavedPlan::inside_pass(int s, int64_t time) const {
  return std::any_of(busy_[s].begin(), busy_[s].end(),
                     [time](const auto& pass) { return pass.first < time && time < pass.second; });
}

// When rank s can run w, whose input (or output's gradient) is ready at `ready`. Transfers are
// rendezvous: both ranks take part at once, between passes. So a transfer meets at the first time
// from `ready` at which neither rank is inside a pass it has run, the pass starts no earlier, and
// no pass starts before a transfer of its rank that it would span: a rank whose neighbour is not
// there yet waits for it, in the simulation as on the devices.
InterleavedPlan::Pass InterleavedPlan::plan_pass(int s, const Work& w, int64_t ready) const {
  const int k = w.chunk * p_ + s, last = p_ * v_ - 1;
  Pass pass;
  pass.start = std::max(busy_[s].empty() ? 0 : busy_[s].back().second, ready);
  pass.from = w.forward ? (k > 0 ? previous(s) : -1) : (k < last ? next(s) : -1);
  if (pass.from >= 0) {
    int64_t time = ready;
    while (inside_pass(pass.from, time) || inside_pass(s, time)) ++time;
    pass.meeting = time;
    pass.start = std::max(pass.start, time);
  }
  const int64_t length = w.forward ? 1 : 2;
  for (bool moved = true; moved;) {
    moved = false;
    for (const int64_t meeting : meetings_[s]) {
      if (pass.start < meeting && meeting < pass.start + length) pass.start = meeting, moved = true;
    }
  }
  return pass;
}

// Rank s's pass w as planned: the transfer it waits for, the pass, and what the pass makes ready.
void InterleavedPlan::run(int s, const Work& w, const Pass& pass, std::vector<int64_t>& inputs,
                          std::vector<int64_t>& grads) {
  const int k = w.chunk * p_ + s, last = p_ * v_ - 1;
  const int64_t end = pass.start + (w.forward ? 1 : 2);
  if (pass.from >= 0) {
    const Key key{pass.meeting, 0, events_++};
    const int sender_chunk = (w.forward ? k - 1 : k + 1) / p_;
    add(pass.from, key,
        {w.forward ? ActionKind::kSendActivation : ActionKind::kSendGradient, w.m, -1,
         sender_chunk},
        s);
    add(s, key,
        {w.forward ? ActionKind::kRecvActivation : ActionKind::kRecvGradient, w.m, -1, w.chunk},
        pass.from);
    meetings_[pass.from].push_back(pass.meeting);
    meetings_[s].push_back(pass.meeting);
  }
  busy_[s].emplace_back(pass.start, end);
  add(s, Key{pass.start, 2, events_++},
      {w.forward ? ActionKind::kForward : ActionKind::kBackward, w.m, -1, w.chunk});
  if (!w.forward) {
    if (k > 0) grads[slot(k - 1, w.m)] = end;
    return;
  }
  if (k < last) {
    inputs[slot(k + 1, w.m)] = end;
    return;
  }
  // Every rank's part of the classifier on m, as soon as the last virtual stage has m's output.
  const Key key{end, 1, events_++};
  for (int r = 0; r < p_; ++r) add(r, key, {ActionKind::kClassifier, w.m});
  grads[slot(last, w.m)] = end;
}

// Rank s's adjacent transfers with one neighbour, one each way, which that neighbour meets
// adjacent too, become one exchange on both: neither waits for the other's half to arrive first.
void InterleavedPlan::merge_exchanges(int s) {
  std::vector<Entry>& mine = lists_[s];
  for (size_t i = 0; i + 1 < mine.size(); ++i) {
    Entry* a = &mine[i];
    Entry* b = &mine[i + 1];
    if (a->action.kind == ActionKind::kRecvGradient) std::swap(a, b);
    if (a->action.kind == ActionKind::kRecvActivation) std::swap(a, b);
    const bool to_next = a->action.kind == ActionKind::kSendActivation &&
                         b->action.kind == ActionKind::kRecvGradient;
    const bool to_previous = a->action.kind == ActionKind::kSendGradient &&
                             b->action.kind == ActionKind::kRecvActivation;
    if (!(to_next || to_previous) || a->peer != b->peer) continue;
    std::vector<Entry>& theirs = lists_[a->peer];
    const auto find = [&theirs](const Key& key) {
      return std::find_if(theirs.begin(), theirs.end(),
                          [&key](const Entry& e) { return e.key == key; });
    };
    auto x = find(a->key), y = find(b->key);
    if (std::abs(x - y) != 1) continue;
    const Action sent = a->action, got = b->action;
    const ActionKind kind =
        to_next ? ActionKind::kSendActivationRecvGradient : ActionKind::kSendGradientRecvActivation;
    const ActionKind their_kind =
        to_next ? ActionKind::kSendGradientRecvActivation : ActionKind::kSendActivationRecvGradient;
    // Their half that sends is what arrives here (y), the one that receives is what leaves (x).
    *std::min(x, y) = {std::min(x, y)->key,
                       {their_kind, y->action.micro_batch, x->action.micro_batch, y->action.chunk,
                        x->action.chunk},
                       s};
    theirs.erase(std::max(x, y));
    mine[i] = {
        mine[i].key, {kind, sent.micro_batch, got.micro_batch, sent.chunk, got.chunk}, a->peer};
    mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
}

// The all-reduce goes before the rank's last backward pass.
void InterleavedPlan::mark_last_pass(int s) {
  std::vector<Entry>& mine = lists_[s];
  const auto last = std::find_if(mine.rbegin(), mine.rend(), [](const Entry& e) {
    return e.action.kind == ActionKind::kBackward;
  });
  const Entry all_reduce{
      last->key, {ActionKind::kAllReduce, last->action.micro_batch, -1, last->action.chunk}};
  mine.insert(last.base() - 1, all_reduce);
}

std::vector<Action> InterleavedPlan::actions(int s) const {
  std::vector<Action> out;
  for (const Entry& e : lists_[s]) out.push_back(e.action);
  return out;
}

}  // namespace

std::vector<Action> schedule_actions(PipelineSchedule schedule, int stages, int stage,
                                     int micro_batches, int chunks) {
  MYRIAD_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
               "no schedule for stage {} of {} with {} micro-batches", stage, stages,
               micro_batches);
  const bool interleaved = schedule == PipelineSchedule::kInterleaved;
  MYRIAD_CHECK(
      interleaved ? stages >= 2 && chunks >= 2 && micro_batches % stages == 0 : chunks == 1,
      "the {} schedule does not run {} micro-batches through {} stages of {} chunks{}",
      schedule_name(schedule), micro_batches, stages, chunks,
      interleaved ? " (it needs 2 or more of each, and the micro-batches in groups of "
                    "one per stage)"
                  : "");
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return gpipe(stages, stage, micro_batches);
    case PipelineSchedule::k1F1B:
      return one_f_one_b(stages, stage, micro_batches);
    case PipelineSchedule::kInterleaved:
      return InterleavedPlan(stages, chunks, micro_batches).take(stage);
  }
  MYRIAD_THROW("no PipelineSchedule {}", static_cast<int>(schedule));
}

std::vector<int64_t> micro_batches_in_flight(PipelineSchedule schedule, int stages,
                                             int micro_batches, int chunks) {
  if (schedule != PipelineSchedule::kInterleaved) {
    std::vector<int64_t> in_flight(static_cast<size_t>(stages), micro_batches);
    if (schedule == PipelineSchedule::k1F1B) {
      for (int s = 0; s < stages; ++s) in_flight[s] = std::min(stages - s, micro_batches);
    }
    return in_flight;
  }
  std::vector<int64_t> in_flight(static_cast<size_t>(stages * chunks), 0);
  InterleavedPlan plan(stages, chunks, micro_batches);
  for (int s = 0; s < stages; ++s) {
    std::vector<int64_t> now(static_cast<size_t>(chunks), 0);
    for (const Action& a : plan.take(s)) {
      int64_t& held = now[static_cast<size_t>(a.chunk)];
      if (a.kind == ActionKind::kForward) {
        int64_t& most = in_flight[static_cast<size_t>(a.chunk * stages + s)];
        most = std::max(most, ++held);
      }
      if (a.kind == ActionKind::kBackward) --held;
    }
  }
  return in_flight;
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
  const auto item = [](int chunk, int m) {
    return (chunk > 0 ? "c" + std::to_string(chunk) + ":" : std::string()) + std::to_string(m);
  };
  text += a.micro_batch == kWholeBatch ? std::string(" whole") : " " + item(a.chunk, a.micro_batch);
  if (a.received >= 0) text += " <- " + item(a.received_chunk, a.received);
  return text;
}

}  // namespace myriad
