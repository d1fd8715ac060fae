#include "myriad/util/timeline.h"

#include <algorithm>
#include <string>
#include <utility>

#include "myriad/util/device.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

namespace {

const char* lane_name(Timeline::Lane lane) {
  switch (lane) {
    case Timeline::Lane::kStage:
      return "stage stream";
    case Timeline::Lane::kParts:
      return "classifier parts stream";
    case Timeline::Lane::kHost:
      return "host (queueing)";
  }
  return "";
}

double microseconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// The metadata events that name process `pid` and place it by its id.
void add_process_metadata(nlohmann::json& out, int pid, const std::string& process) {
  out.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process}}}});
  out.push_back(
      {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
}

// A region's event (its name and args) made complete ("X"): on `lane` of process `pid`, from
// `begin_us` to `end_us` (no earlier than it begins).
nlohmann::json complete_event(nlohmann::json event, int pid, Timeline::Lane lane, double begin_us,
                              double end_us) {
  event["cat"] = lane_name(lane);
  event["ph"] = "X";
  event["pid"] = pid;
  event["tid"] = static_cast<int>(lane);
  event["ts"] = begin_us;
  event["dur"] = std::max(0.0, end_us - begin_us);
  return event;
}

// The metadata events that name a lane of process `pid` and place it by its number.
void add_lane_metadata(nlohmann::json& out, int pid, Timeline::Lane lane) {
  const int tid = static_cast<int>(lane);
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", tid},
                 {"args", {{"name", lane_name(lane)}}}});
  out.push_back({{"name", "thread_sort_index"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", tid},
                 {"args", {{"sort_index", tid}}}});
}

}  // namespace

struct Timeline::Step {
  int64_t step = 0;
  Clock::time_point host;
#ifdef MYRIAD_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> event;
#endif
};

struct Timeline::Region {
  std::string name;
  int micro_batch = -1;
  int chunk = -1;
  Lane lane = Lane::kStage;
  size_t step = 0;  // index into steps_
  Clock::time_point host_begin, host_end;
  bool closed = false;
#ifdef MYRIAD_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> begin, end;
#endif

  // Its event's name and args, of traced step `traced_step`: the name gains the micro-batch and
  // chunk, which the args also give.
  nlohmann::json event_of(int64_t traced_step) const;
};

nlohmann::json Timeline::Region::event_of(int64_t traced_step) const {
  nlohmann::json args = {{"step", traced_step}};
  std::string event_name = name;
  if (micro_batch >= 0) {
    args["micro_batch"] = micro_batch;
    event_name += " " + std::to_string(micro_batch);
  }
  if (chunk >= 0) {
    args["chunk"] = chunk;
    event_name += " (chunk " + std::to_string(chunk) + ")";
  }
  return {{"name", std::move(event_name)}, {"args", std::move(args)}};
}

Timeline::Timeline(const torch::Device& device) : device_(device) {}

Timeline::~Timeline() = default;

void Timeline::start_step(int64_t step) {
  synchronize_device(device_);
  Step s;
  s.step = step;
#ifdef MYRIAD_WITH_CUDA
  if (device_.is_cuda()) {
    s.event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    s.event->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    // The device is idle: the event completes now, and the host's clock is read with it.
    s.event->synchronize();
  }
#endif
  s.host = Clock::now();
  steps_.push_back(std::move(s));
}

int64_t Timeline::steps() const {
  return static_cast<int64_t>(steps_.size());
}

size_t Timeline::open(const char* name, int micro_batch, Lane lane, int chunk) {
  MYRIAD_CHECK(!steps_.empty(), "a timeline region '{}' began before any traced step", name);
  Region r;
  r.name = name;
  r.micro_batch = micro_batch;
  r.chunk = chunk;
  r.lane = lane;
  r.step = steps_.size() - 1;
#ifdef MYRIAD_WITH_CUDA
  if (device_.is_cuda()) {
    r.begin = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    r.begin->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  r.host_begin = Clock::now();
  regions_.push_back(std::move(r));
  return regions_.size() - 1;
}

void Timeline::close(size_t index) {
  Region& r = regions_.at(index);
  r.host_end = Clock::now();
#ifdef MYRIAD_WITH_CUDA
  if (device_.is_cuda()) {
    r.end = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    r.end->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  r.closed = true;
}

Timeline::Scope::Scope(Timeline* timeline, const char* name, int micro_batch, Lane lane, int chunk)
    : timeline_(timeline) {
  if (timeline_ != nullptr) index_ = timeline_->open(name, micro_batch, lane, chunk);
}

Timeline::Scope::~Scope() {
  if (timeline_ != nullptr) timeline_->close(index_);
}

nlohmann::json Timeline::events(int pid, const std::string& process) const {
  nlohmann::json out = nlohmann::json::array();
  add_process_metadata(out, pid, process);
  std::vector<bool> used(3, false);
  const auto add = [&](const Region& r, Lane lane, double begin_us, double end_us) {
    used[static_cast<size_t>(lane)] = true;
    out.push_back(complete_event(r.event_of(steps_[r.step].step), pid, lane, begin_us, end_us));
  };
  for (const Region& r : regions_) {
    if (!r.closed) continue;
    const Step& s = steps_[r.step];
    // A step's times are its reference's plus how far the step's reference is from the first.
    const double offset = microseconds(s.host - steps_.front().host);
    const double host_begin = offset + microseconds(r.host_begin - s.host);
    const double host_end = offset + microseconds(r.host_end - s.host);
#ifdef MYRIAD_WITH_CUDA
    if (device_.is_cuda()) {
      r.end->synchronize();
      add(r, r.lane, offset + 1e3 * s.event->elapsed_time(*r.begin),
          offset + 1e3 * s.event->elapsed_time(*r.end));
      add(r, Lane::kHost, host_begin, host_end);
      continue;
    }
#endif
    add(r, r.lane, host_begin, host_end);
  }
  for (size_t lane = 0; lane < used.size(); ++lane) {
    if (used[lane]) add_lane_metadata(out, pid, static_cast<Lane>(lane));
  }
  return out;
}

}  // namespace myriad
