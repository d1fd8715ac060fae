#include "myriad/comm/nccl_communicator.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/util/check_cuda.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/check_nccl.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/log.h"
#include "tensor_rows.h"

#define NCCL_CALL(call) check((call), #call, __FILE__, __LINE__)

namespace myriad {

namespace {

ncclDataType_t nccl_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kFloat16:
      return ncclFloat16;
    case torch::kInt64:
      return ncclInt64;
    case torch::kInt32:
      return ncclInt32;
    case torch::kUInt8:
      return ncclUint8;
    case torch::kInt8:
      return ncclInt8;
    default:
      MYRIAD_THROW("no NCCL datatype for {}", c10::toString(dtype));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  MYRIAD_THROW("unknown reduction");
}

char* byte_ptr(const torch::Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

}  // namespace

// The end events of the operations enqueued, for the watchdog's line: the last kEager enqueued
// directly (older ones have finished, or the GPU is still behind them), and every one recorded
// into a CUDA graph (the events are the graphs' nodes, so they live as long as the communicator,
// which must outlive its graphs). The enqueueing threads (the training thread, autograd's) write
// it; the watchdog's thread reads it, and never waits for them: CUDA calls are made outside the
// lock, which a launch blocked on a full work queue would otherwise hold.
class NcclCommunicator::Trail {
 public:
  Trail() : eager_(kEager) {}
  ~Trail() {
    for (const std::vector<Op>* ops : {&eager_, &recorded_}) {
      for (const Op& op : *ops) {
        if (op.done != nullptr) cudaEventDestroy(op.done);
      }
    }
    for (cudaEvent_t event : spare_) cudaEventDestroy(event);
  }
  Trail(const Trail&) = delete;
  Trail& operator=(const Trail&) = delete;

  void record(cudaStream_t stream, const char* what, int64_t bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MYRIAD_CHECK_CUDA(cudaStreamIsCapturing(stream, &capture));
    const bool in_graph = capture == cudaStreamCaptureStatusActive;
    // Graphs re-recorded without end: the operations beyond kRecorded go unnamed.
    if (in_graph && recorded_full()) return;
    // The event of an operation that left the eager ring is reused: no event is created on the
    // hot path once the ring is full.
    cudaEvent_t done = take_spare();
    if (done == nullptr) MYRIAD_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    // In a capture, an external event becomes a node of the graph that every replay records.
    const cudaError_t recorded =
        in_graph ? cudaEventRecordWithFlags(done, stream, cudaEventRecordExternal)
                 : cudaEventRecord(done, stream);
    cudaEvent_t unused = done;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (recorded == cudaSuccess) {
        const Op op{++enqueued_, what, bytes, in_graph, done};
        if (!in_graph) {
          Op& slot = eager_[eager_count_++ % kEager];
          unused = slot.done;
          slot = op;
        } else {
          recorded_.push_back(op);
          unused = nullptr;
        }
      }
      // Never queried again (the watchdog reads events under the lock): free to record anew.
      if (unused != nullptr) spare_.push_back(unused);
    }
    MYRIAD_CHECK_CUDA(recorded);
  }

  // "not finished on this GPU: ...": the first operation recorded into a graph and the first
  // enqueued directly whose end event has not been reached, and how many in all; empty if none,
  // or if an enqueueing thread holds the trail.
  std::string unfinished() const {
    const std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return "";
    const Op* first[2] = {nullptr, nullptr};  // in a graph, directly
    int pending = 0;
    for (const std::vector<Op>* ops : {&recorded_, &eager_}) {
      for (const Op& op : *ops) {
        if (op.seq == 0 || cudaEventQuery(op.done) != cudaErrorNotReady) continue;
        ++pending;
        const Op*& kept = first[op.in_graph ? 0 : 1];
        if (kept == nullptr || op.seq < kept->seq) kept = &op;
      }
    }
    (void)cudaGetLastError();  // a query's cudaErrorNotReady is no error of this thread's
    if (pending == 0) return "";
    std::string text = "not finished on this GPU: ";
    for (const Op* op : first) {
      if (op == nullptr) continue;
      if (op != first[0] && first[0] != nullptr) text += " and ";
      text += str_format("{} #{} ({}{})", op->what, op->seq, format_bytes(op->bytes),
                         op->in_graph ? ", recorded in a CUDA graph" : "");
    }
    return text + str_format(" ({} of this communicator's operations in all)", pending);
  }

 private:
  struct Op {
    uint64_t seq = 0;  // 0: not used yet
    const char* what = nullptr;
    int64_t bytes = 0;
    bool in_graph = false;
    cudaEvent_t done = nullptr;
  };
  bool recorded_full() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return recorded_.size() >= kRecorded;
  }
  cudaEvent_t take_spare() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (spare_.empty()) return nullptr;
    const cudaEvent_t event = spare_.back();
    spare_.pop_back();
    return event;
  }

  static constexpr size_t kEager = 64;
  static constexpr size_t kRecorded = 4096;
  mutable std::mutex mutex_;
  uint64_t enqueued_ = 0;
  uint64_t eager_count_ = 0;
  std::vector<Op> eager_;  // a ring of kEager
  std::vector<Op> recorded_;
  std::vector<cudaEvent_t> spare_;
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, torch::Device device, int max_ctas)
    : Communicator(comm), device_(device), trail_(std::make_unique<Trail>()) {
  MYRIAD_CHECK(device.is_cuda() && device.has_index(),
               "NCCL needs a CUDA device with an index, got {}", device.str());
  ncclUniqueId id;
  if (rank() == 0) MYRIAD_CHECK_NCCL(ncclGetUniqueId(&id), nullptr);
  MYRIAD_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, control()));
  c10::cuda::CUDAGuard guard(device_);
  if (max_ctas > 0) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.minCTAs = 1;
    config.maxCTAs = max_ctas;
    MYRIAD_CHECK_NCCL(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), nullptr);
  } else {
    MYRIAD_CHECK_NCCL(ncclCommInitRank(&comm_, size(), id, rank()), nullptr);
  }
  int version = 0;
  ncclGetVersion(&version);
  log_debug("NCCL {} communicator ready on {} ({} ranks, {} CTAs per kernel)", version,
            device_.str(), size(), max_ctas > 0 ? "at most " + std::to_string(max_ctas) : "NCCL's");
  // ncclCommAbort may be called from another thread; it releases a host blocked on NCCL's work.
  watchdog_abort_ =
      HangWatchdog::instance().register_abort([comm = comm_] { ncclCommAbort(comm); },
                                              [trail = trail_.get(), device = device_] {
                                                // The watchdog's thread: its CUDA calls on this
                                                // communicator's device, not device 0.
                                                const c10::cuda::CUDAGuard on_device(device);
                                                return trail->unfinished();
                                              });
}

NcclCommunicator::~NcclCommunicator() {
  if (watchdog_abort_ >= 0) HangWatchdog::instance().unregister_abort(watchdog_abort_);
  if (comm_ == nullptr || aborted_) return;
  // While an error unwinds, peers may be gone; destroying would wait for them.
  if (std::uncaught_exceptions() > 0) {
    ncclCommAbort(comm_);
  } else {
    ncclCommDestroy(comm_);
  }
}

void NcclCommunicator::check(ncclResult_t rc, const char* expr, const char* file, int line) {
  if (rc == ncclSuccess) return;
  const std::string detail = std::string(ncclGetErrorString(rc)) + ": " + ncclGetLastError(comm_);
  if (!aborted_) {
    HangWatchdog::instance().unregister_abort(watchdog_abort_);
    watchdog_abort_ = -1;
    ncclCommAbort(comm_);
    aborted_ = true;
  }
  throw_error(file, line,
              str_format("NCCL call failed: {}: {} (communicator aborted)", expr, detail));
}

cudaStream_t NcclCommunicator::begin() const {
  MYRIAD_CHECK(!aborted_, "the NCCL communicator was aborted by an earlier error");
  return c10::cuda::getCurrentCUDAStream(device_.index()).stream();
}

void NcclCommunicator::all_reduce_impl(torch::Tensor& tensor, ReduceOp op) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  NCCL_CALL(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                          nccl_type(tensor.scalar_type()), nccl_op(op), comm_, stream));
  trail_->record(stream, "all_reduce", static_cast<int64_t>(tensor.nbytes()));
}

void NcclCommunicator::all_gather_impl(const torch::Tensor& input, torch::Tensor& output,
                                       const std::vector<int64_t>& counts, bool equal) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  const ncclDataType_t type = nccl_type(input.scalar_type());
  if (equal) {
    NCCL_CALL(
        ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type, comm_, stream));
    trail_->record(stream, "all_gather", static_cast<int64_t>(output.nbytes()));
    return;
  }
  // NCCL has no all-gather-v: one broadcast per root, fused into one group.
  const int64_t row = row_numel(output);
  const int64_t row_bytes = row * output.element_size();
  int64_t offset = 0;
  NCCL_CALL(ncclGroupStart());
  for (int r = 0; r < size(); ++r) {
    if (counts[r] > 0) {
      // The send buffer is read on root r only.
      NCCL_CALL(ncclBroadcast(input.data_ptr(), byte_ptr(output) + offset * row_bytes,
                              counts[r] * row, type, r, comm_, stream));
    }
    offset += counts[r];
  }
  NCCL_CALL(ncclGroupEnd());
  trail_->record(stream, "all_gather", static_cast<int64_t>(output.nbytes()));
}

void NcclCommunicator::reduce_scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                                           const std::vector<int64_t>& counts, bool equal,
                                           ReduceOp op) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  const ncclDataType_t type = nccl_type(input.scalar_type());
  if (equal) {
    NCCL_CALL(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type,
                                nccl_op(op), comm_, stream));
    trail_->record(stream, "reduce_scatter", static_cast<int64_t>(input.nbytes()));
    return;
  }
  // One reduce per root, each delivering that root's block of rows, fused into one group.
  const int64_t row = row_numel(input);
  const int64_t row_bytes = row * input.element_size();
  int64_t offset = 0;
  NCCL_CALL(ncclGroupStart());
  for (int r = 0; r < size(); ++r) {
    if (counts[r] > 0) {
      // The receive buffer is written on root r only.
      NCCL_CALL(ncclReduce(byte_ptr(input) + offset * row_bytes, output.data_ptr(), counts[r] * row,
                           type, nccl_op(op), r, comm_, stream));
    }
    offset += counts[r];
  }
  NCCL_CALL(ncclGroupEnd());
  trail_->record(stream, "reduce_scatter", static_cast<int64_t>(input.nbytes()));
}

void NcclCommunicator::broadcast_impl(torch::Tensor& tensor, int root) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  NCCL_CALL(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                          nccl_type(tensor.scalar_type()), root, comm_, stream));
  trail_->record(stream, "broadcast", static_cast<int64_t>(tensor.nbytes()));
}

void NcclCommunicator::gather_impl(const torch::Tensor& input, torch::Tensor& output,
                                   const std::vector<int64_t>& counts, int root) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  const ncclDataType_t type = nccl_type(input.scalar_type());
  const int64_t row = row_numel(input);
  NCCL_CALL(ncclGroupStart());
  if (rank() == root) {
    int64_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      if (counts[r] > 0) {
        char* slot = byte_ptr(output) + offset * row * output.element_size();
        if (r == root) {
          MYRIAD_CHECK_CUDA(cudaMemcpyAsync(slot, input.data_ptr(), input.nbytes(),
                                            cudaMemcpyDeviceToDevice, stream));
        } else {
          NCCL_CALL(ncclRecv(slot, counts[r] * row, type, r, comm_, stream));
        }
      }
      offset += counts[r];
    }
  } else if (counts[rank()] > 0) {
    NCCL_CALL(ncclSend(input.data_ptr(), counts[rank()] * row, type, root, comm_, stream));
  }
  NCCL_CALL(ncclGroupEnd());
  trail_->record(stream, "gather", static_cast<int64_t>(input.nbytes()));
}

void NcclCommunicator::scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                                    const std::vector<int64_t>& counts, int root) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  const ncclDataType_t type = nccl_type(output.scalar_type());
  const int64_t row = row_numel(output);
  NCCL_CALL(ncclGroupStart());
  if (rank() == root) {
    int64_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      if (counts[r] > 0) {
        const char* slot = byte_ptr(input) + offset * row * input.element_size();
        if (r == root) {
          MYRIAD_CHECK_CUDA(cudaMemcpyAsync(output.data_ptr(), slot, output.nbytes(),
                                            cudaMemcpyDeviceToDevice, stream));
        } else {
          NCCL_CALL(ncclSend(slot, counts[r] * row, type, r, comm_, stream));
        }
      }
      offset += counts[r];
    }
  } else if (counts[rank()] > 0) {
    NCCL_CALL(ncclRecv(output.data_ptr(), counts[rank()] * row, type, root, comm_, stream));
  }
  NCCL_CALL(ncclGroupEnd());
  trail_->record(stream, "scatter", static_cast<int64_t>(output.nbytes()));
}

void NcclCommunicator::p2p_impl(const std::vector<torch::Tensor>& sent,
                                const std::vector<torch::Tensor>& received, int peer) {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  // One group: both directions progress together, so two ranks sending to each other do not wait
  // on each other.
  NCCL_CALL(ncclGroupStart());
  for (const torch::Tensor& t : sent) {
    NCCL_CALL(ncclSend(t.data_ptr(), t.numel(), nccl_type(t.scalar_type()), peer, comm_, stream));
  }
  int64_t bytes = 0;
  for (const torch::Tensor& t : received) {
    NCCL_CALL(ncclRecv(t.data_ptr(), t.numel(), nccl_type(t.scalar_type()), peer, comm_, stream));
    bytes += static_cast<int64_t>(t.nbytes());
  }
  NCCL_CALL(ncclGroupEnd());
  for (const torch::Tensor& t : sent) bytes += static_cast<int64_t>(t.nbytes());
  trail_->record(stream, "send/recv", bytes);
}

void NcclCommunicator::barrier_impl() {
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = begin();
  MYRIAD_CHECK_CUDA(cudaStreamSynchronize(stream));
  ncclResult_t async_error = ncclSuccess;
  NCCL_CALL(ncclCommGetAsyncError(comm_, &async_error));
  NCCL_CALL(async_error);
  MYRIAD_CHECK_MPI(MPI_Barrier(control()));
}

}  // namespace myriad
