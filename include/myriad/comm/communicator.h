#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace myriad {

enum class ReduceOp { kSum, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// Element types every backend moves: float64, float32, bfloat16, float16, int64, int32, uint8
// and int8. MPI has no half-precision arithmetic; its backend reduces bfloat16 and float16 with
// custom operations that accumulate each pair in float32.
bool is_communicable_dtype(torch::ScalarType dtype);

// The data plane: collectives on torch tensors among the ranks of one MPI communicator. Two
// backends implement it (MPI for CPU tensors, NCCL for CUDA tensors); CommFactory picks one by
// device.
//
// Every collective is checked before it moves data: all ranks exchange a short description of
// their call over MPI (operation, dtype, shape, device, counts, root), and if any rank's call is
// malformed or differs from the others, every rank throws the same collective Error naming the
// offending rank. A mismatch therefore never hangs or corrupts memory. The check costs one small
// MPI_Allgather on the host and no device synchronisation; MYRIAD_COMM_CHECKS=0 turns it off.
//
// The NCCL backend enqueues work on LibTorch's current CUDA stream, so results are ordered with
// the caller's kernels without extra synchronisation.
class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;
  // The device whose tensors this communicator moves.
  virtual torch::Device device() const = 0;
  // Whether its collectives can be recorded into a CUDA graph (stream capture) and replayed: NCCL
  // enqueues device work only, MPI blocks the host.
  virtual bool capturable() const { return false; }

  // In place; every rank passes a contiguous tensor of the same dtype and shape.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Concatenates every rank's `input` along dim 0; every rank passes the same shape.
  torch::Tensor all_gather(const torch::Tensor& input);
  // Rank r passes counts[r] rows (dim 0); every rank passes the same counts.
  torch::Tensor all_gather(const torch::Tensor& input, const std::vector<int64_t>& counts);
  // Reduces `input` over ranks and returns this rank's block of dim-0 rows: input.size(0)/size()
  // rows each, or counts[r] rows for rank r.
  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op = ReduceOp::kSum);
  torch::Tensor reduce_scatter(const torch::Tensor& input, const std::vector<int64_t>& counts,
                               ReduceOp op = ReduceOp::kSum);
  // In place; root's tensor overwrites everyone's.
  void broadcast(torch::Tensor& tensor, int root);
  // Root receives every rank's rows in rank order (counts[r] from rank r); the other ranks get
  // an empty tensor.
  torch::Tensor gather(const torch::Tensor& input, const std::vector<int64_t>& counts, int root);
  // Root's `input` holds sum(counts) rows; rank r receives counts[r] of them. The other ranks'
  // `input` only gives the dtype and row shape.
  torch::Tensor scatter(const torch::Tensor& input, const std::vector<int64_t>& counts, int root);
  // Returns when every rank has arrived and the work it queued before has finished.
  void barrier();

  // Point to point: `tensors` (contiguous, on this communicator's device) go to rank `peer`, which
  // takes them with recv; on GPUs they move in one NCCL group, ordered with the current stream. An
  // undefined tensor is sent as nothing, and arrives undefined. Before any data moves the two
  // ranks exchange what they are about to do over MPI, as collectives agree on their arguments:
  // the receiver learns the shapes, and a pair that disagrees (other dtypes or another number of
  // tensors, two ranks both sending, a malformed tensor) is an Error on both ranks, never a hang or
  // corrupt memory.
  void send(const std::vector<torch::Tensor>& tensors, int peer);
  // What `peer` sends: one tensor per entry of `dtypes`, which the sent tensors must have
  // (torch::ScalarType::Undefined: any dtype, taken from the sender).
  std::vector<torch::Tensor> recv(const std::vector<torch::ScalarType>& dtypes, int peer);
  // send and recv with the same peer at once (one NCCL group; MPI's non-blocking calls), for two
  // ranks that each have something for the other: neither waits for the other's to arrive
  // before its own leaves (1F1B's activations one way, gradients the other). The peer calls
  // exchange too; it is agreed on as send and recv are.
  std::vector<torch::Tensor> exchange(const std::vector<torch::Tensor>& tensors,
                                      const std::vector<torch::ScalarType>& dtypes, int peer);

  // One integer per rank, exchanged over MPI with no device synchronisation.
  std::vector<int64_t> all_gather_counts(int64_t local) const;

  // Turns the cross-rank argument agreement off for this communicator, for internal traffic
  // whose shapes are fixed and were agreed on once (gradient buckets).
  void set_checks(bool enabled) { checks_ = enabled; }
  bool checks() const { return checks_; }

 protected:
  // Duplicates `control` for this communicator's own agreement traffic.
  explicit Communicator(MPI_Comm control);
  MPI_Comm control() const { return control_; }

  // The backends. Arguments are already validated and agreed on by every rank; `counts` always
  // has one entry per rank, and `equal` says all entries are the same.
  virtual void all_reduce_impl(torch::Tensor& tensor, ReduceOp op) = 0;
  virtual void all_gather_impl(const torch::Tensor& input, torch::Tensor& output,
                               const std::vector<int64_t>& counts, bool equal) = 0;
  virtual void reduce_scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                                   const std::vector<int64_t>& counts, bool equal, ReduceOp op) = 0;
  virtual void broadcast_impl(torch::Tensor& tensor, int root) = 0;
  virtual void gather_impl(const torch::Tensor& input, torch::Tensor& output,
                           const std::vector<int64_t>& counts, int root) = 0;
  virtual void scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                            const std::vector<int64_t>& counts, int root) = 0;
  virtual void barrier_impl() = 0;
  // Sends `sent` to `peer` and receives `received` from it, at once; defined tensors only, already
  // agreed on by both ranks, either list possibly empty.
  virtual void p2p_impl(const std::vector<torch::Tensor>& sent,
                        const std::vector<torch::Tensor>& received, int peer) = 0;

 private:
  struct Call;
  void agree(const Call& call) const;
  // send, recv and exchange: agree with the peer, then move the data. Returns what was received.
  std::vector<torch::Tensor> point_to_point(const std::vector<torch::Tensor>* tensors,
                                            const std::vector<torch::ScalarType>* dtypes, int peer,
                                            const char* what);
  // The pairwise agreement: returns the peer's description of what it sends.
  std::vector<int64_t> agree_with_peer(const std::vector<int64_t>& mine, int peer,
                                       const char* what) const;
  torch::Tensor gather_rows(const char* name, const torch::Tensor& input,
                            const std::vector<int64_t>& counts, bool equal);
  torch::Tensor reduce_rows(const char* name, const torch::Tensor& input,
                            const std::vector<int64_t>& counts, bool equal, ReduceOp op);

  MPI_Comm control_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool checks_ = true;
};

// Within its scope, `comm`'s collectives skip the cross-rank agreement when `skip` is true (each
// call's local checks still run), for a caller that agreed on their arguments beforehand: a part
// of a step whose collectives would otherwise each wait on the host for every rank to arrive.
class AgreedBeforehand {
 public:
  AgreedBeforehand(Communicator& comm, bool skip) : comm_(comm), checks_(comm.checks()) {
    if (skip) comm_.set_checks(false);
  }
  ~AgreedBeforehand() { comm_.set_checks(checks_); }
  AgreedBeforehand(const AgreedBeforehand&) = delete;
  AgreedBeforehand& operator=(const AgreedBeforehand&) = delete;

 private:
  Communicator& comm_;
  bool checks_;
};

}  // namespace myriad
