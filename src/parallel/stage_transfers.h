#pragma once

// The step's transfers between neighbouring stages of a pipeline, and the stream on which the
// stages before the last run their classifier parts under 1F1B, which the transfers order.

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "graph_capture.h"
#endif

namespace myriad {

class Communicator;
class Timeline;

// Where a stage before the last runs its classifier parts under 1F1B: a high-priority stream of
// its own. Every rank takes part in part m, and the last stage runs it between m's forward and
// backward. Queued on the first stage's stream, it waited there behind that stage's next forward:
// 7-8 ms a micro-batch of r200 at P = 2 on H200s, a bubble of 0.42 instead of GPipe's 0.15. On a
// stream of its own it runs beside that forward. Each part runs after the stage's work queued up
// to the latest mark (the step's start: the rows begin_parts chose, the last update; then each
// transfer), and the stage's stream waits for the part (join) only before its next transfer or
// the step's end, not at once: a part is queued before the stage's next forward (1F1B),
// which must not wait for it. So no NCCL kernel of one communicator waits on this GPU beside one
// of another that it depends on through the other ranks: NCCL does not promise that two such
// kernels run at once.
class PartsStream {
 public:
#ifdef MYRIAD_WITH_CUDA
  explicit PartsStream(c10::DeviceIndex device)
      : device_(device), parts_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)) {}
  // The parts queued from now on run after everything the stage has queued so far.
  void mark() {
    marked_.record(c10::cuda::getCurrentCUDAStream(device_));
  }
  void run(const std::function<void()>& part) {
    marked_.block(parts_);
    {
      const c10::cuda::CUDAStreamGuard on_parts(parts_);
      part();
    }
    joined_ = false;
  }
  // The stage's stream waits for the parts queued so far.
  void join() {
    if (joined_) return;
    wait_for_stream(c10::cuda::getCurrentCUDAStream(device_), parts_);
    joined_ = true;
  }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream parts_;
  at::cuda::CUDAEvent marked_;
  bool joined_ = true;
#else
  // The host runs a CPU stage's work in order: there is nothing to run beside.
  void mark() {}
  void run(const std::function<void()>& part) {
    part();
  }
  void join() {}
#endif
};

// Sends, receives and exchanges with the neighbouring stages over `pipe`: counted (bytes sent),
// traced on the timeline, and, where the stage has a parts stream, joined with it before and
// marked after, so that the parts and the transfers' NCCL kernels never wait on each other.
class StageTransfers {
 public:
  StageTransfers(Communicator* pipe, std::unique_ptr<PartsStream> parts);

  void send(const std::vector<torch::Tensor>& tensors, int peer);
  std::vector<torch::Tensor> recv(const std::vector<torch::ScalarType>& dtypes, int peer);
  std::vector<torch::Tensor> exchange(const std::vector<torch::Tensor>& tensors,
                                      const std::vector<torch::ScalarType>& dtypes, int peer);
  // The parts stream, or null where parts run in the stage's stream.
  PartsStream* parts() { return parts_.get(); }
  void drop_parts_stream() { parts_.reset(); }
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Bytes sent since the last call.
  double take_bytes_sent();

 private:
  void count_sent(const std::vector<torch::Tensor>& tensors);

  Communicator* pipe_;
  std::unique_ptr<PartsStream> parts_;
  Timeline* timeline_ = nullptr;
  double bytes_sent_ = 0.0;
};

}  // namespace myriad
