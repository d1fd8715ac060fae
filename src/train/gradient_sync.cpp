#include "myriad/train/gradient_sync.h"

#include <chrono>
#include <map>

#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace myriad {

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
#endif
};

#ifdef MYRIAD_WITH_CUDA
struct GradientSynchronizer::CudaState {
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAEvent wait_start{cudaEventDefault};
  at::cuda::CUDAEvent wait_end{cudaEventDefault};
  explicit CudaState(const torch::Device& device)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {}
};
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
  if (device_.is_cuda()) cuda_ = std::make_unique<CudaState>(device_);
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
    bucket.start.record(cuda_->stream);
    all_reduce(bucket);
    bucket.done.record(cuda_->stream);
    return;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  all_reduce(bucket);
  bucket.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
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
  // The sums stay where the all-reduce left them: each .grad becomes a view of its slot, which
  // replaces the gradient autograd accumulated (no copy).
  for (size_t k = 0; k < params_.size(); ++k) params_[k].mutable_grad() = slot_view(k);
  for (auto& b : buckets_) {
    b->launched = false;
    b->pending = static_cast<int64_t>(b->params.size());
  }
  for (Slot& slot : slots_) slot.received = slot.counted = false;
  last_pass_ = true;
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

void GradientSynchronizer::pass_summed(bool last) {
  for (Slot& slot : slots_) slot.received = true;
  if (!last) return;
  for (auto& b : buckets_) {
    if (!b->launched) launch(*b);
  }
}

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
