#include "myriad/parallel/gradient_sync.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "myriad/util/check_cuda.h"
#endif

namespace myriad {

#ifdef MYRIAD_WITH_CUDA
// An event that a CUDA graph records each time it is replayed (an event-record node): the events
// recorded during a capture only order its streams, and no replay records them.
struct GraphEvent {
  cudaEvent_t event = nullptr;
  GraphEvent() { MYRIAD_CHECK_CUDA(cudaEventCreate(&event)); }
  ~GraphEvent() { cudaEventDestroy(event); }
  GraphEvent(const GraphEvent&) = delete;
  GraphEvent& operator=(const GraphEvent&) = delete;
  void record(const c10::cuda::CUDAStream& stream) {
    MYRIAD_CHECK_CUDA(cudaEventRecordWithFlags(event, stream.stream(), cudaEventRecordExternal));
  }
  float ms_until(const GraphEvent& later) const {
    float ms = 0.0F;
    MYRIAD_CHECK_CUDA(cudaEventElapsedTime(&ms, event, later.event));
    return ms;
  }
};

#endif

struct GradientSynchronizer::Bucket {
  std::vector<size_t> params;
  torch::Tensor flat;
  torch::Tensor wire;  // flat in --grad-comm-dtype, when that is narrower
  int64_t pending = 0;
  bool launched = false;
  double host_ms = 0.0;  // CPU: the all-reduce's duration
#ifdef MYRIAD_WITH_CUDA
  at::cuda::CUDAEvent ready;  // gradients copied in, on the backward stream
  at::cuda::CUDAEvent start{cudaEventDefault};
  at::cuda::CUDAEvent done{cudaEventDefault};
  // The same moments inside a graph, recorded by the graph's replays.
  std::unique_ptr<GraphEvent> graph_start, graph_done;
#endif
};

#ifdef MYRIAD_WITH_CUDA
struct GradientSynchronizer::CudaState {
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAEvent wait_start{cudaEventDefault};
  at::cuda::CUDAEvent wait_end{cudaEventDefault};
  GraphEvent backward_done, all_done;  // in the graph: the last gradient, the last all-reduce
  explicit CudaState(const torch::Device& device)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {}
};

namespace {

// Calls back once autograd has added a parameter's gradient into its .grad.
class SummedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit SummedHook(std::function<void()> call) : call_(std::move(call)) {}
  void operator()(const torch::autograd::Variable&) override { call_(); }

 private:
  std::function<void()> call_;
};

}  // namespace
#else
struct GradientSynchronizer::CudaState {};
#endif

GradientSynchronizer::GradientSynchronizer(std::vector<torch::Tensor> params,
                                           std::unique_ptr<Communicator> comm, int64_t bucket_bytes,
                                           torch::ScalarType wire_dtype)
    : params_(std::move(params)), comm_(std::move(comm)), device_(comm_->device()) {
  MYRIAD_CHECK(bucket_bytes > 0, "the bucket size must be positive");
  MYRIAD_CHECK(wire_dtype == torch::kFloat32 || wire_dtype == torch::kBFloat16 ||
                   wire_dtype == torch::kFloat16,
               "gradients travel as float32, bfloat16 or float16, not {}", wire_dtype);
  // Every rank must bucket the same parameters the same way; one check here lets the buckets'
  // all-reduces skip the per-call agreement.
  uint64_t layout = 0;
  for (const torch::Tensor& p : params_) {
    layout = mix64(layout ^ static_cast<uint64_t>(p.numel()) ^
                   (static_cast<uint64_t>(p.scalar_type()) << 48));
  }
  const std::vector<int64_t> layouts = comm_->all_gather_counts(static_cast<int64_t>(layout));
  for (size_t r = 0; r < layouts.size(); ++r) {
    MYRIAD_CHECK_COLLECTIVE(layouts[r] == layouts[0],
                            "rank {} has different backbone parameters than rank 0", r);
  }
  comm_->set_checks(false);

  slots_.resize(params_.size());
  std::map<torch::ScalarType, size_t> open;  // dtype -> bucket being filled
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    MYRIAD_CHECK(p.device() == device_, "parameter on {} but gradients are synchronised on {}",
                 p.device().str(), device_.str());
    auto it = open.find(p.scalar_type());
    if (it == open.end() || buckets_[it->second]->flat.numel() * p.element_size() >= bucket_bytes) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->flat = torch::empty({0}, p.options());
      it = open.insert_or_assign(p.scalar_type(), buckets_.size() - 1).first;
    }
    Bucket& b = *buckets_[it->second];
    slots_[k] = {it->second, b.flat.numel()};
    b.params.push_back(k);
    b.flat = torch::empty({b.flat.numel() + p.numel()}, p.options());
  }
  for (auto& b : buckets_) {
    b->flat.zero_();
    b->pending = static_cast<int64_t>(b->params.size());
    if (b->flat.scalar_type() == torch::kFloat32 && wire_dtype != torch::kFloat32)
      b->wire = torch::empty_like(b->flat, b->flat.options().dtype(wire_dtype));
  }
#ifdef MYRIAD_WITH_CUDA
  if (device_.is_cuda()) {
    cuda_ = std::make_unique<CudaState>(device_);
    for (auto& b : buckets_) {
      b->graph_start = std::make_unique<GraphEvent>();
      b->graph_done = std::make_unique<GraphEvent>();
    }
  }
#endif
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(
        params_[k].register_hook([this, k](const torch::Tensor& grad) { on_gradient(k, grad); }));
  }
}

GradientSynchronizer::~GradientSynchronizer() {
  for (size_t k = 0; k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

torch::Tensor GradientSynchronizer::slot_view(size_t param) const {
  const Slot& slot = slots_[param];
  const torch::Tensor& p = params_[param];
  // The parameter's own strides over its slot: a channels-last weight's gradient is copied in
  // and read back without a transposition.
  return buckets_[slot.bucket]->flat.as_strided(
      p.sizes(), p.strides(), buckets_[slot.bucket]->flat.storage_offset() + slot.offset);
}

void GradientSynchronizer::on_gradient(size_t param, const torch::Tensor& grad) {
  if (hooks_paused_) return;
  Slot& slot = slots_[param];
  Bucket& bucket = *buckets_[slot.bucket];
  torch::Tensor view = slot_view(param);
  // Later passes (micro-batches) add to the first.
  if (slot.received) {
    view.add_(grad);
  } else {
    view.copy_(grad);
    slot.received = true;
  }
  if (!last_pass_ || slot.counted) return;
  slot.counted = true;
  if (--bucket.pending == 0) launch(bucket);
}

void GradientSynchronizer::launch(Bucket& bucket) {
  bucket.launched = true;
#ifdef MYRIAD_WITH_CUDA
  if (cuda_) {
    // The all-reduce waits for this bucket's copies only, then runs beside the rest of backward.
    bucket.ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    bucket.ready.block(cuda_->stream);
    c10::cuda::CUDAStreamGuard guard(cuda_->stream);
    if (recording_) {
      bucket.graph_start->record(cuda_->stream);
    } else {
      bucket.start.record(cuda_->stream);
    }
    all_reduce(bucket);
    if (recording_) bucket.graph_done->record(cuda_->stream);
    // Also inside a graph: what the recording stream's join waits for.
    bucket.done.record(cuda_->stream);
    return;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  all_reduce(bucket);
  bucket.host_ms = 1e3 * seconds_since(start);
}

void GradientSynchronizer::all_reduce(Bucket& bucket) {
  if (!bucket.wire.defined()) {
    comm_->all_reduce(bucket.flat, ReduceOp::kSum);
    return;
  }
  bucket.wire.copy_(bucket.flat);
  comm_->all_reduce(bucket.wire, ReduceOp::kSum);
  bucket.flat.copy_(bucket.wire);
}

void GradientSynchronizer::finish() {
  stats_from_graph_ = all_reduced_in_graph_;
  // A replay that all-reduced the buckets joined its communication on the stream it ran on.
  if (!all_reduced_in_graph_) {
    for (auto& b : buckets_) {
      if (b->launched) continue;
      for (size_t k : b->params) {
        if (!slots_[k].received) slot_view(k).zero_();
      }
      launch(*b);
    }
#ifdef MYRIAD_WITH_CUDA
    if (cuda_) {
      const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
      cuda_->wait_start.record(current);
      for (auto& b : buckets_) b->done.block(current);
      cuda_->wait_end.record(current);
    }
#endif
  }
  // The sums stay where the all-reduce left them: each .grad becomes a view of its slot, which
  // replaces the gradient autograd accumulated (no copy).
  for (size_t k = 0; k < params_.size(); ++k) params_[k].mutable_grad() = slot_view(k);
  reset_counts();
  last_pass_ = true;
  all_reduced_in_graph_ = false;
}

void GradientSynchronizer::reset_counts() {
  for (auto& b : buckets_) {
    b->launched = false;
    b->pending = static_cast<int64_t>(b->params.size());
  }
  for (Slot& slot : slots_) slot.received = slot.counted = false;
}

std::vector<torch::Tensor> GradientSynchronizer::gradient_views() const {
  std::vector<torch::Tensor> views;
  for (size_t k = 0; k < params_.size(); ++k) views.push_back(slot_view(k));
  return views;
}

void GradientSynchronizer::zero_buckets() {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) b->flat.zero_();
}

void GradientSynchronizer::pass_replayed(bool last, bool all_reduced) {
  for (Slot& slot : slots_) slot.received = true;
  if (!last) return;
  for (auto& b : buckets_) {
    if (all_reduced) {
      b->launched = true;
    } else if (!b->launched) {
      launch(*b);
    }
  }
  all_reduced_in_graph_ = all_reduced;
}

std::shared_ptr<GradientSynchronizer> GradientSynchronizer::share() {
  std::shared_ptr<GradientSynchronizer> self = weak_from_this().lock();
  MYRIAD_CHECK(self != nullptr,
               "CUDA graphs record the gradients' all-reduces: their synchroniser must be held by "
               "a std::shared_ptr, which the graphs share");
  return self;
}

bool GradientSynchronizer::can_record_all_reduce() const {
  return cuda_ != nullptr && comm_->capturable();
}

bool GradientSynchronizer::all_agree(bool ok) {
  // Over MPI, not NCCL: no collective of this communicator runs eagerly between a recording of
  // its all-reduces and their first replay.
  const std::vector<int64_t> all = comm_->all_gather_counts(ok ? 1 : 0);
  return std::all_of(all.begin(), all.end(), [](int64_t v) { return v == 1; });
}

void GradientSynchronizer::on_summed(size_t param) {
  Slot& slot = slots_[param];
  if (slot.counted) return;
  slot.counted = true;
  Bucket& bucket = *buckets_[slot.bucket];
  if (--bucket.pending == 0 && record_all_reduce_) launch(bucket);
}

#ifdef MYRIAD_WITH_CUDA
GradientSynchronizer::GraphBackward::GraphBackward(GradientSynchronizer& sync, bool all_reduce)
    : sync_(sync) {
  MYRIAD_CHECK(!all_reduce || sync.can_record_all_reduce(),
               "a CUDA graph can record the gradient all-reduce only through NCCL");
  if (all_reduce && !sync.nccl_warm_) {
    // NCCL sets up a communicator's connections at its first collective: eagerly, not in the
    // capture. The buckets hold zeros here (a step's first pass has not run), so the sums
    // change nothing; every rank of the synchroniser records the same graphs at the same time.
    for (auto& b : sync.buckets_) sync.launch(*b);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(sync.device_.index());
    for (auto& b : sync.buckets_) b->done.block(current);
    sync.nccl_warm_ = true;
  }
  sync.reset_counts();
  sync.recording_ = true;
  sync.record_all_reduce_ = all_reduce;
  for (size_t k = 0; k < sync.params_.size(); ++k) {
    sync.params_[k].mutable_grad() = sync.slot_view(k);
    torch::autograd::impl::set_post_acc_grad_hooks(
        sync.params_[k], std::make_unique<SummedHook>([&sync, k] { sync.on_summed(k); }));
  }
}

GradientSynchronizer::GraphBackward::~GraphBackward() {
  for (torch::Tensor& p : sync_.params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    p.mutable_grad().reset();
  }
  sync_.recording_ = false;
  sync_.record_all_reduce_ = false;
  sync_.reset_counts();
}

void GradientSynchronizer::GraphBackward::join() {
  if (!sync_.record_all_reduce_) return;
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(sync_.device_.index());
  sync_.cuda_->backward_done.record(current);
  // Buckets of parameters that got no gradient: their places hold the zeros of zero_buckets().
  for (auto& b : sync_.buckets_) {
    if (!b->launched) sync_.launch(*b);
  }
  for (auto& b : sync_.buckets_) b->done.block(current);
  sync_.cuda_->all_done.record(current);
}
#else
GradientSynchronizer::GraphBackward::GraphBackward(GradientSynchronizer& sync, bool) : sync_(sync) {
  MYRIAD_THROW("CUDA graphs need a build with CUDA");
}
GradientSynchronizer::GraphBackward::~GraphBackward() = default;
void GradientSynchronizer::GraphBackward::join() {}
#endif

void GradientSynchronizer::begin_pass(bool last) {
  last_pass_ = last;
  clear_gradients();
}

std::vector<torch::Tensor> GradientSynchronizer::buffers() const {
  std::vector<torch::Tensor> flat;
  for (const auto& b : buckets_) flat.push_back(b->flat);
  return flat;
}

void GradientSynchronizer::clear_gradients() {
  for (torch::Tensor& p : params_) p.mutable_grad().reset();
}

GradientSyncStats GradientSynchronizer::last_stats() {
  GradientSyncStats stats;
#ifdef MYRIAD_WITH_CUDA
  if (cuda_ && stats_from_graph_) {
    MYRIAD_CHECK_CUDA(cudaEventSynchronize(cuda_->all_done.event));
    for (auto& b : buckets_) stats.all_reduce_ms += b->graph_start->ms_until(*b->graph_done);
    stats.exposed_ms = cuda_->backward_done.ms_until(cuda_->all_done);
    return stats;
  }
  if (cuda_) {
    cuda_->wait_end.synchronize();
    for (auto& b : buckets_) stats.all_reduce_ms += b->start.elapsed_time(b->done);
    stats.exposed_ms = cuda_->wait_start.elapsed_time(cuda_->wait_end);
    return stats;
  }
#endif
  // On the CPU every all-reduce runs inline in backward: none of it is hidden.
  for (auto& b : buckets_) stats.all_reduce_ms += b->host_ms;
  stats.exposed_ms = stats.all_reduce_ms;
  return stats;
}

void broadcast_tensors(const std::vector<torch::Tensor>& tensors, Communicator& comm) {
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const torch::Tensor& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> flat_parts;
    for (const torch::Tensor& t : group) flat_parts.push_back(t.detach().reshape(-1));
    torch::Tensor flat = torch::cat(flat_parts);
    comm.broadcast(flat, 0);
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (torch::Tensor t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

}  // namespace myriad
