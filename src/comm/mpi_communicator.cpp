#include "myriad/comm/mpi_communicator.h"

#include <climits>

#include "mpi_types.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/error.h"
#include "tensor_rows.h"

namespace myriad {

namespace {

// MPI counts are ints. Element counts that overflow are expressed in whole rows instead, through
// a contiguous datatype of one row; the rows must then fit.
class RowUnits {
 public:
  RowUnits(const torch::Tensor& like, const std::vector<int64_t>& rows, const char* what)
      : base_(mpi_datatype(like.scalar_type())) {
    const int64_t row = row_numel(like);
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    if (total * row <= INT_MAX) {
      unit_ = row;
      type_ = base_;
      return;
    }
    MYRIAD_CHECK(total <= INT_MAX && row <= INT_MAX,
                 "{}: {} rows of {} elements exceed what one MPI call can address", what, total,
                 row);
    MYRIAD_CHECK_MPI(MPI_Type_contiguous(static_cast<int>(row), base_, &owned_));
    MYRIAD_CHECK_MPI(MPI_Type_commit(&owned_));
    type_ = owned_;
    unit_ = 1;
  }
  ~RowUnits() {
    if (owned_ != MPI_DATATYPE_NULL) MPI_Type_free(&owned_);
  }
  RowUnits(const RowUnits&) = delete;
  RowUnits& operator=(const RowUnits&) = delete;

  MPI_Datatype type() const { return type_; }
  // Counts and displacements, in units of type(), for per-rank row counts.
  void layout(const std::vector<int64_t>& rows, std::vector<int>& counts,
              std::vector<int>& displs) const {
    counts.resize(rows.size());
    displs.resize(rows.size());
    int64_t offset = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      counts[r] = static_cast<int>(rows[r] * unit_);
      displs[r] = static_cast<int>(offset);
      offset += rows[r] * unit_;
    }
  }

 private:
  MPI_Datatype base_;
  MPI_Datatype owned_ = MPI_DATATYPE_NULL;
  MPI_Datatype type_;
  int64_t unit_ = 1;
};

constexpr int64_t kMaxElementsPerCall = int64_t{1} << 30;
constexpr int kDataTag = 0x6d64;  // "md": point-to-point data

// `bytes` at `data` in messages of at most kMaxElementsPerCall bytes (MPI counts are ints).
template <class Call>
void in_messages(void* data, int64_t bytes, Call call) {
  auto* base = static_cast<char*>(data);
  for (int64_t start = 0; start < bytes; start += kMaxElementsPerCall) {
    call(base + start, static_cast<int>(std::min(kMaxElementsPerCall, bytes - start)));
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm)
    : Communicator(comm), half_types_(std::make_unique<HalfTypesLease>()) {
  MYRIAD_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MYRIAD_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce_impl(torch::Tensor& tensor, ReduceOp op) {
  const MPI_Datatype type = mpi_datatype(tensor.scalar_type());
  const MPI_Op mpi_op = mpi_reduce_op(op, tensor.scalar_type());
  auto* base = static_cast<char*>(tensor.data_ptr());
  const int64_t element = tensor.element_size();
  for (int64_t start = 0; start < tensor.numel(); start += kMaxElementsPerCall) {
    const int count = static_cast<int>(std::min(kMaxElementsPerCall, tensor.numel() - start));
    MYRIAD_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, base + start * element, count, type, mpi_op, comm_));
  }
}

void MpiCommunicator::all_gather_impl(const torch::Tensor& input, torch::Tensor& output,
                                      const std::vector<int64_t>& counts, bool equal) {
  RowUnits units(input, counts, "all_gather");
  std::vector<int> sizes, displs;
  units.layout(counts, sizes, displs);
  if (equal) {
    MYRIAD_CHECK_MPI(MPI_Allgather(input.data_ptr(), sizes[0], units.type(), output.data_ptr(),
                                   sizes[0], units.type(), comm_));
  } else {
    MYRIAD_CHECK_MPI(MPI_Allgatherv(input.data_ptr(), sizes[rank()], units.type(),
                                    output.data_ptr(), sizes.data(), displs.data(), units.type(),
                                    comm_));
  }
}

void MpiCommunicator::reduce_scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                                          const std::vector<int64_t>& counts, bool equal,
                                          ReduceOp op) {
  const int64_t row = row_numel(input);
  MYRIAD_CHECK(input.numel() <= INT_MAX,
               "reduce_scatter: {} elements exceed what one MPI reduction can address on the CPU "
               "backend",
               input.numel());
  std::vector<int> sizes(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) sizes[r] = static_cast<int>(counts[r] * row);
  const MPI_Datatype type = mpi_datatype(input.scalar_type());
  const MPI_Op mpi_op = mpi_reduce_op(op, input.scalar_type());
  if (equal) {
    MYRIAD_CHECK_MPI(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(), sizes[0], type,
                                              mpi_op, comm_));
  } else {
    MYRIAD_CHECK_MPI(
        MPI_Reduce_scatter(input.data_ptr(), output.data_ptr(), sizes.data(), type, mpi_op, comm_));
  }
}

void MpiCommunicator::broadcast_impl(torch::Tensor& tensor, int root) {
  in_messages(tensor.data_ptr(), tensor.numel() * tensor.element_size(), [&](char* at, int count) {
    MYRIAD_CHECK_MPI(MPI_Bcast(at, count, MPI_BYTE, root, comm_));
  });
}

void MpiCommunicator::gather_impl(const torch::Tensor& input, torch::Tensor& output,
                                  const std::vector<int64_t>& counts, int root) {
  RowUnits units(input, counts, "gather");
  std::vector<int> sizes, displs;
  units.layout(counts, sizes, displs);
  MYRIAD_CHECK_MPI(MPI_Gatherv(input.data_ptr(), sizes[rank()], units.type(), output.data_ptr(),
                               sizes.data(), displs.data(), units.type(), root, comm_));
}

void MpiCommunicator::scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                                   const std::vector<int64_t>& counts, int root) {
  RowUnits units(output, counts, "scatter");
  std::vector<int> sizes, displs;
  units.layout(counts, sizes, displs);
  MYRIAD_CHECK_MPI(MPI_Scatterv(input.data_ptr(), sizes.data(), displs.data(), units.type(),
                                output.data_ptr(), sizes[rank()], units.type(), root, comm_));
}

void MpiCommunicator::p2p_impl(const std::vector<torch::Tensor>& sent,
                               const std::vector<torch::Tensor>& received, int peer) {
  // Non-blocking, so that two ranks sending to each other at once both complete; messages of one
  // direction keep their order (MPI's non-overtaking rule).
  std::vector<MPI_Request> requests;
  for (const torch::Tensor& t : received) {
    in_messages(t.data_ptr(), t.numel() * t.element_size(), [&](char* at, int count) {
      requests.emplace_back();
      MYRIAD_CHECK_MPI(MPI_Irecv(at, count, MPI_BYTE, peer, kDataTag, comm_, &requests.back()));
    });
  }
  for (const torch::Tensor& t : sent) {
    in_messages(t.data_ptr(), t.numel() * t.element_size(), [&](char* at, int count) {
      requests.emplace_back();
      MYRIAD_CHECK_MPI(MPI_Isend(at, count, MPI_BYTE, peer, kDataTag, comm_, &requests.back()));
    });
  }
  MYRIAD_CHECK_MPI(
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

void MpiCommunicator::barrier_impl() {
  MYRIAD_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace myriad
