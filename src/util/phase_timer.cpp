#include "myriad/util/phase_timer.h"

#include <chrono>

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

struct PhaseTimer::Boundary {
  std::string ended;  // the phase this boundary ends ("" for none)
  std::chrono::steady_clock::time_point host;
#ifdef MYRIAD_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> event;
#endif
};

PhaseTimer::PhaseTimer(const torch::Device& device, bool enabled)
    : device_(device), enabled_(enabled) {}

PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::mark(const std::string& phase) {
  if (!enabled_ || paused_) return;
  Boundary b;
  b.ended = running_;
  b.host = std::chrono::steady_clock::now();
#ifdef MYRIAD_WITH_CUDA
  if (device_.is_cuda()) {
    b.event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    b.event->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  boundaries_.push_back(std::move(b));
  running_ = phase;
}

void PhaseTimer::stop() {
  mark("");
}

void PhaseTimer::collect() {
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    const Boundary& start = boundaries_[i - 1];
    const Boundary& end = boundaries_[i];
    if (end.ended.empty()) continue;
    double ms = std::chrono::duration<double, std::milli>(end.host - start.host).count();
#ifdef MYRIAD_WITH_CUDA
    if (device_.is_cuda()) {
      end.event->synchronize();
      ms = start.event->elapsed_time(*end.event);
    }
#endif
    totals_[end.ended] += ms;
  }
  // The last boundary starts the running phase; keep it as the next interval's start.
  if (!boundaries_.empty()) boundaries_.erase(boundaries_.begin(), boundaries_.end() - 1);
}

std::map<std::string, double> PhaseTimer::totals() {
  collect();
  return totals_;
}

void PhaseTimer::reset() {
  boundaries_.clear();
  totals_.clear();
  running_.clear();
}

}  // namespace myriad
