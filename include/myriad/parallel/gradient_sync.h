#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "myriad/comm/communicator.h"

namespace myriad {

struct GradientSyncStats {
  double all_reduce_ms = 0.0;  // time the bucket all-reduces took, last step
  double exposed_ms = 0.0;     // of which the step waited for after backward
};

// Data-parallel gradient synchronisation of the replicated backbone. Gradients are SUMMED over
// ranks: the classifier's loss is already the mean over the global batch (docs/classifier.md).
//
// Parameters are grouped into buckets of about `bucket_bytes`, in reverse order of registration,
// roughly the order backward produces their gradients. A hook on each parameter copies its
// gradient into its bucket; when a bucket is complete its all-reduce starts at once, on a CUDA
// stream of its own (waiting only for the bucket's gradients), so communication overlaps the rest
// of backward. finish() reduces buckets still incomplete (parameters without a gradient count as
// zero), waits, and points every parameter's .grad at its sum in the bucket (a view with the
// parameter's strides: no copy). clear_gradients() drops those views before the next backward, so
// that autograd hands each new gradient over instead of adding it to the old sum. On the CPU the
// all-reduces run inline. Construction checks that every rank registers the same parameters.
//
// `wire_dtype` (--grad-comm-dtype) compresses the all-reduce, as arcface_torch's fp16 hook does:
// a float32 bucket is cast to it, summed in it, and cast back, on the communication stream. It
// halves the bytes on slow links between hosts at the price of bf16's (or fp16's) rounding of the
// sum; an fp16 overflow shows as a non-finite gradient, which fp16 training's loss scaler skips.
class GradientSynchronizer : public std::enable_shared_from_this<GradientSynchronizer> {
 public:
  GradientSynchronizer(std::vector<torch::Tensor> params, std::unique_ptr<Communicator> comm,
                       int64_t bucket_bytes, torch::ScalarType wire_dtype = torch::kFloat32);
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  // Before the backward of each micro-batch of a step (gradient accumulation): gradients of
  // every pass are summed into the buckets, and only the `last` pass launches the all-reduces, one
  // per bucket and step, not one per micro-batch. A step of one backward needs no call. It drops
  // the .grad that autograd kept from the pass before: the hooks summed that into the buckets
  // already, and autograd would otherwise add every later pass into it too, one more kernel per
  // parameter and pass, and a second copy of every gradient.
  void begin_pass(bool last);
  // After the last backward: every parameter's .grad then holds the sum over passes and ranks.
  void finish();
  // The buckets' flat buffers, which hold every gradient after finish(): a multi-tensor pass over
  // these (loss-scale unscaling) touches all gradients in a few launches.
  std::vector<torch::Tensor> buffers() const;
  // Before the next backward: leaves every .grad undefined.
  void clear_gradients();
  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }

  // For a backward that sums the gradients into the buckets itself, as the CUDA graphs of a stage
  // do (StageGraphs): each parameter's place in its bucket (the view finish() hands out), zeroed
  // by zero_buckets() before the step's first pass. After each replayed pass, pass_replayed()
  // records that every parameter has its gradient; after the `last`, the buckets' all-reduces ran
  // inside that replay if it was recorded with them (`all_reduced`), and are launched now if not.
  std::vector<torch::Tensor> gradient_views() const;
  void zero_buckets();
  void pass_replayed(bool last, bool all_reduced);
  // Another owner of this synchroniser, for whatever records its all-reduces or events (CUDA
  // graphs) and must not outlive it; an Error unless a std::shared_ptr holds it.
  std::shared_ptr<GradientSynchronizer> share();
  // Whether a graph can record the all-reduces (a communicator that NCCL runs).
  bool can_record_all_reduce() const;
  // Every rank of this synchroniser holds `ok` (collective, on the host).
  bool all_agree(bool ok);

  // While hooks are paused they ignore gradients, so that a graph's warm-up leaves the buckets
  // alone; the pause ends with the scope, on failure too.
  class PausedHooks {
   public:
    explicit PausedHooks(GradientSynchronizer& sync) : sync_(sync) { sync_.hooks_paused_ = true; }
    ~PausedHooks() { sync_.hooks_paused_ = false; }
    PausedHooks(const PausedHooks&) = delete;
    PausedHooks& operator=(const PausedHooks&) = delete;

   private:
    GradientSynchronizer& sync_;
  };

  // The recording of a backward into a CUDA graph (StageGraphs), opened before its capture begins.
  // Each parameter's .grad is its place in the buckets meanwhile, so that autograd adds every
  // gradient into it in place (the graph's memory holds no second copy of the gradients), and a
  // hook after that addition counts the parameter's bucket down. With `all_reduce` (the step's
  // last pass) a bucket's all-reduce, with --grad-comm-dtype's casts, is recorded as soon as its
  // last gradient is in, on the communication stream forked from the recording one: every replay
  // then overlaps it with the rest of the backward, as an eager step does. join(), inside the
  // capture after the backward, records the rest and the recording stream's wait for them all.
  // Closing it puts the gradients and hooks back, on failure too. A graph that recorded the
  // all-reduces holds this synchroniser (share()): NCCL's communicator waits for the graphs that
  // use it, and the graphs replay its events. CUDA builds only.
  class GraphBackward {
   public:
    GraphBackward(GradientSynchronizer& sync, bool all_reduce);
    ~GraphBackward();
    GraphBackward(const GraphBackward&) = delete;
    GraphBackward& operator=(const GraphBackward&) = delete;
    void join();

   private:
    GradientSynchronizer& sync_;
  };

  // Timing of the last finished step (waits for the device).
  GradientSyncStats last_stats();

 private:
  struct Bucket;
  struct Slot {
    size_t bucket;
    int64_t offset;
    bool received = false;  // a gradient arrived in some pass of this step
    bool counted = false;   // ... in the last pass, where buckets count down to their launch
  };
  torch::Tensor slot_view(size_t param) const;
  void on_gradient(size_t param, const torch::Tensor& grad);
  // A parameter's gradient was added into its place by a backward being recorded.
  void on_summed(size_t param);
  void launch(Bucket& bucket);
  // Resets the per-step counts of every bucket and parameter.
  void reset_counts();
  // The bucket's sum over ranks, in place, through its wire buffer when it has one.
  void all_reduce(Bucket& bucket);

  std::vector<torch::Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<unsigned> hooks_;
  std::unique_ptr<Communicator> comm_;
  torch::Device device_;
  bool last_pass_ = true;
  bool hooks_paused_ = false;
  bool recording_ = false;             // a GraphBackward is open
  bool record_all_reduce_ = false;     // ... with the all-reduces
  bool all_reduced_in_graph_ = false;  // this step's all-reduces ran inside a replay
  bool stats_from_graph_ = false;      // ... the last finished step's did
  bool nccl_warm_ = false;             // a first all-reduce of every bucket ran eagerly
  struct CudaState;
  std::unique_ptr<CudaState> cuda_;
};

// Copies rank 0's `tensors` into every rank's (collective), coalesced into one broadcast per
// dtype: a module's parameters and buffers at the start, so that replicas start identical
// (BufferBroadcast keeps the buffers identical from then on).
void broadcast_tensors(const std::vector<torch::Tensor>& tensors, Communicator& comm);

}  // namespace myriad
