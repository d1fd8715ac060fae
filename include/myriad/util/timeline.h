#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace myriad {

// A timeline of one rank's work (docs/pipeline.md, "Timeline"): regions (a micro-batch's forward
// or backward, the classifier, a transfer) between two CUDA events on the stream that ran them
// (the host clock on the CPU), and on GPUs also the host's time queueing each. Times count from
// a reference taken at each traced step's start, once the device is idle and, by the caller's
// barrier, every rank is there: so the ranks' timelines line up without a clock they share.
// events() gives Chrome's trace event format, which chrome://tracing and ui.perfetto.dev show.
class Timeline {
 public:
  // The rows of a rank's timeline; the host's row is only kept on GPUs, where it differs from
  // the device's.
  enum class Lane { kStage = 0, kParts = 1, kHost = 2 };

  explicit Timeline(const torch::Device& device);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // The reference of traced step `step`: waits for the device's work, then reads the clocks.
  // Call it on every rank right after one barrier.
  void start_step(int64_t step);
  // Steps started so far.
  int64_t steps() const;

  // A region: the work queued on the current stream during its scope. A null timeline (not
  // tracing) records nothing.
  class Scope {
   public:
    // `chunk`: the model chunk of an interleaved stage whose pass it is (-1: the stage is one).
    Scope(Timeline* timeline, const char* name, int micro_batch = -1, Lane lane = Lane::kStage,
          int chunk = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;
    size_t index_ = 0;
  };

  // Every region so far as complete ("X") trace events of process `pid`, with the process named
  // `process` and its lanes named (waits for the regions' events). Regions open when it is called
  // are left out.
  nlohmann::json events(int pid, const std::string& process) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Region;
  struct Step;

  size_t open(const char* name, int micro_batch, Lane lane, int chunk);
  void close(size_t index);

  torch::Device device_;
  std::vector<Step> steps_;
  std::vector<Region> regions_;
};

}  // namespace myriad
