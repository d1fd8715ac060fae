#pragma once

// CUDA graph capture and streams for the training code (src/parallel, not installed): the scopes
// StageGraphs records a stage's graphs in, and profile_blocks times a block's replay in, and the
// ordering of one stream after another. CUDA builds only.

#ifdef MYRIAD_WITH_CUDA

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <optional>
#include <utility>

namespace myriad {

using PoolId = decltype(std::declval<at::cuda::CUDAGraph&>().pool());

// One capture into `graph` (sharing `pool`, if given), begun on the current stream. A capture left
// without end() (an error inside it) is ended and its memory pool released, so that the allocator
// stops serving it and gives its memory back.
class Capture {
 public:
  Capture(at::cuda::CUDAGraph& graph, c10::DeviceIndex device, PoolId pool = {0, 0})
      : graph_(graph), device_(device) {
    // Other threads (data loading, checkpoint writing) may use CUDA meanwhile.
    graph_.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  }
  ~Capture() {
    if (ended_) return;
    try {
      graph_.capture_end();
    } catch (const std::exception&) {
      // The capture was invalid (a stream forked into it and never joined): capture_end threw
      // before handing the pool back, so this does it; the error itself is the one already
      // propagating. cudaStreamEndCapture's status is not sticky, but would be read as a later
      // launch's error.
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, graph_.pool());
      c10::cuda::CUDACachingAllocator::releasePool(device_, graph_.pool());
      (void)cudaGetLastError();
    }
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;
  void end() {
    ended_ = true;
    graph_.capture_end();
  }

 private:
  at::cuda::CUDAGraph& graph_;
  c10::DeviceIndex device_;
  bool ended_ = false;
};

// Autocast's cache of cast weights off for the scope: casts must be made inside the graph, not
// taken from a cache that is emptied after it.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_;
};

// Work queued on `waiter` from now on runs after everything queued on `done` so far.
inline void wait_for_stream(c10::cuda::CUDAStream waiter, c10::cuda::CUDAStream done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

// The scope's work on a stream of its own, forked from the current one and joined back at its end
// (on failure too): a capture needs a stream other than the legacy default.
class SideStream {
 public:
  explicit SideStream(c10::DeviceIndex device)
      : current_(c10::cuda::getCurrentCUDAStream(device)),
        side_(c10::cuda::getStreamFromPool(false, device)) {
    wait_for_stream(side_, current_);
    guard_.emplace(side_);
  }
  ~SideStream() {
    guard_.reset();
    join_.record(side_);
    join_.block(current_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

 private:
  c10::cuda::CUDAStream current_, side_;
  at::cuda::CUDAEvent join_;
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};

}  // namespace myriad

#endif  // MYRIAD_WITH_CUDA
