#include "myriad/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "collective_signature.h"
#include "myriad/comm/hang_watchdog.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/error.h"
#include "tensor_rows.h"

namespace myriad {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool is_communicable_dtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat64:
    case torch::kFloat32:
    case torch::kBFloat16:
    case torch::kFloat16:
    case torch::kInt64:
    case torch::kInt32:
    case torch::kUInt8:
    case torch::kInt8:
      return true;
    default:
      return false;
  }
}

// One collective call as this rank sees it, before validation.
struct Communicator::Call {
  const char* name;
  const torch::Tensor& tensor;
  ShapeRule rule = ShapeRule::kSameShape;
  bool in_place = false;
  int64_t op = -1;
  int64_t root = -1;
  const std::vector<int64_t>* counts = nullptr;
  // Rows this rank's tensor must have; -1 when any number is fine.
  int64_t expected_rows = -1;
  // Rows must split evenly over the ranks (equal reduce-scatter).
  bool divisible_rows = false;
};

Communicator::Communicator(MPI_Comm control) {
  MYRIAD_CHECK_MPI(MPI_Comm_dup(control, &control_));
  MYRIAD_CHECK_MPI(MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN));
  MYRIAD_CHECK_MPI(MPI_Comm_rank(control_, &rank_));
  MYRIAD_CHECK_MPI(MPI_Comm_size(control_, &size_));
  const char* checks = std::getenv("MYRIAD_COMM_CHECKS");
  checks_ = checks == nullptr || std::string(checks) != "0";
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
}

void Communicator::agree(const Call& call) const {
  const torch::Tensor& t = call.tensor;
  CollectiveSignature sig = describe_call(call.name, t, call.rule, call.op, call.root, call.counts);
  CallProblem problem = CallProblem::kNone;
  const torch::Device expected = device();
  if (!is_communicable_dtype(t.scalar_type())) {
    problem = CallProblem::kDtype;
  } else if (t.device().type() != expected.type() ||
             (expected.has_index() && t.device().index() != expected.index())) {
    problem = CallProblem::kDevice;
  } else if (call.in_place && !t.is_contiguous()) {
    problem = CallProblem::kNotContiguous;
  } else if (t.dim() > kMaxSignatureDims) {
    problem = CallProblem::kTooManyDims;
  } else if (call.rule == ShapeRule::kSameRowShape && t.dim() == 0) {
    problem = CallProblem::kNoRowDim;
  } else if (call.root != -1 && (call.root < 0 || call.root >= size_)) {
    problem = CallProblem::kRoot;
  } else if (call.counts != nullptr && static_cast<int>(call.counts->size()) != size_) {
    problem = CallProblem::kCountsSize;
  } else if (call.counts != nullptr && std::any_of(call.counts->begin(), call.counts->end(),
                                                   [](int64_t c) { return c < 0; })) {
    problem = CallProblem::kNegativeCount;
  } else if (call.expected_rows >= 0 && t.size(0) != call.expected_rows) {
    problem = CallProblem::kRowsMismatch;
    sig.expected_rows = call.expected_rows;
  } else if (call.divisible_rows && (t.dim() == 0 || t.size(0) % size_ != 0)) {
    problem = call.tensor.dim() == 0 ? CallProblem::kNoRowDim : CallProblem::kIndivisible;
  }
  sig.problem = static_cast<int64_t>(problem);

  if (!checks_) {
    if (problem != CallProblem::kNone) {
      MYRIAD_THROW("{}", describe_problem(call.name, rank_, sig, expected));
    }
    return;
  }
  static_assert(sizeof(CollectiveSignature) % sizeof(int64_t) == 0, "signature is int64 words");
  const int words = sizeof(CollectiveSignature) / sizeof(int64_t);
  std::vector<CollectiveSignature> all(size_);
  MYRIAD_CHECK_MPI(
      MPI_Allgather(&sig, words, MPI_INT64_T, all.data(), words, MPI_INT64_T, control_));
  const std::string disagreement = find_disagreement(call.name, all, expected);
  MYRIAD_CHECK_COLLECTIVE(disagreement.empty(), "{}", disagreement);
}

void Communicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  const WaitScope wait("all_reduce", backend(), size_);
  Call call{"all_reduce", tensor};
  call.in_place = true;
  call.op = static_cast<int64_t>(op);
  agree(call);
  if (tensor.numel() > 0) all_reduce_impl(tensor, op);
}

torch::Tensor Communicator::gather_rows(const char* name, const torch::Tensor& input,
                                        const std::vector<int64_t>& counts, bool equal) {
  const WaitScope wait(name, backend(), size_);
  Call call{name, input};
  call.rule = equal ? ShapeRule::kSameShape : ShapeRule::kSameRowShape;
  call.counts = equal ? nullptr : &counts;
  call.expected_rows = equal ? -1 : (static_cast<int>(counts.size()) == size_ ? counts[rank_] : -1);
  agree(call);
  std::vector<int64_t> rows = equal ? std::vector<int64_t>(size_, input.size(0)) : counts;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  torch::Tensor output = torch::empty(shape, input.options());
  if (output.numel() > 0) all_gather_impl(input.contiguous(), output, rows, equal);
  return output;
}

torch::Tensor Communicator::all_gather(const torch::Tensor& input) {
  return gather_rows("all_gather", input, {}, true);
}

torch::Tensor Communicator::all_gather(const torch::Tensor& input,
                                       const std::vector<int64_t>& counts) {
  return gather_rows("all_gather", input, counts, false);
}

torch::Tensor Communicator::reduce_rows(const char* name, const torch::Tensor& input,
                                        const std::vector<int64_t>& counts, bool equal,
                                        ReduceOp op) {
  const WaitScope wait(name, backend(), size_);
  Call call{name, input};
  call.op = static_cast<int64_t>(op);
  call.rule = equal ? ShapeRule::kSameShape : ShapeRule::kSameRowShape;
  call.counts = equal ? nullptr : &counts;
  call.divisible_rows = equal;
  if (!equal && static_cast<int>(counts.size()) == size_) {
    call.expected_rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  }
  agree(call);
  std::vector<int64_t> rows = equal ? std::vector<int64_t>(size_, input.size(0) / size_) : counts;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rows[rank_];
  torch::Tensor output = torch::empty(shape, input.options());
  if (input.numel() > 0) reduce_scatter_impl(input.contiguous(), output, rows, equal, op);
  return output;
}

torch::Tensor Communicator::reduce_scatter(const torch::Tensor& input, ReduceOp op) {
  return reduce_rows("reduce_scatter", input, {}, true, op);
}

torch::Tensor Communicator::reduce_scatter(const torch::Tensor& input,
                                           const std::vector<int64_t>& counts, ReduceOp op) {
  return reduce_rows("reduce_scatter", input, counts, false, op);
}

void Communicator::broadcast(torch::Tensor& tensor, int root) {
  const WaitScope wait("broadcast", backend(), size_);
  Call call{"broadcast", tensor};
  call.in_place = true;
  call.root = root;
  agree(call);
  if (tensor.numel() > 0) broadcast_impl(tensor, root);
}

torch::Tensor Communicator::gather(const torch::Tensor& input, const std::vector<int64_t>& counts,
                                   int root) {
  const WaitScope wait("gather", backend(), size_);
  Call call{"gather", input};
  call.rule = ShapeRule::kSameRowShape;
  call.counts = &counts;
  call.root = root;
  call.expected_rows = static_cast<int>(counts.size()) == size_ ? counts[rank_] : -1;
  agree(call);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rank_ == root ? std::accumulate(counts.begin(), counts.end(), int64_t{0}) : 0;
  torch::Tensor output = torch::empty(shape, input.options());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (total * row_numel(input) > 0) gather_impl(input.contiguous(), output, counts, root);
  return output;
}

torch::Tensor Communicator::scatter(const torch::Tensor& input, const std::vector<int64_t>& counts,
                                    int root) {
  const WaitScope wait("scatter", backend(), size_);
  Call call{"scatter", input};
  call.rule = ShapeRule::kSameRowShape;
  call.counts = &counts;
  call.root = root;
  if (rank_ == root && static_cast<int>(counts.size()) == size_) {
    call.expected_rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  }
  agree(call);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = counts[rank_];
  torch::Tensor output = torch::empty(shape, input.options());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (total * row_numel(input) > 0) scatter_impl(input.contiguous(), output, counts, root);
  return output;
}

void Communicator::barrier() {
  const WaitScope wait("barrier", backend(), size_);
  barrier_impl();
}

namespace {

// A point-to-point description: two halves, what a rank sends and what it expects to receive.
// A half is [present, problem, count, then per tensor whether it is defined, its dtype, rank and
// sizes (-1: any, on the receiving side)]. Every call describes both halves, so that any two
// calls can be compared: a send against a recv, an exchange against an exchange, and the pairs
// that cannot meet.
constexpr int64_t kMaxP2pTensors = 8;
constexpr int64_t kTensorWords = 3 + kMaxSignatureDims;
constexpr int64_t kHalfWords = 3 + kMaxP2pTensors * kTensorWords;
constexpr int64_t kP2pWords = 2 * kHalfWords;
constexpr int64_t kSentHalf = 0;
constexpr int64_t kExpectedHalf = kHalfWords;
constexpr int kP2pTag = 0x6d70;  // "mp"

int64_t* slot(int64_t* half, int64_t i) {
  return half + 3 + i * kTensorWords;
}
const int64_t* slot(const int64_t* half, int64_t i) {
  return half + 3 + i * kTensorWords;
}

std::string tensors_text(const int64_t* half) {
  std::string text;
  for (int64_t i = 0; i < std::min(half[2], kMaxP2pTensors); ++i) {
    const int64_t* t = slot(half, i);
    text += i == 0 ? "" : ", ";
    if (t[0] == 0) {
      text += "none";
      continue;
    }
    text += t[1] < 0 ? "any dtype" : c10::toString(static_cast<c10::ScalarType>(t[1]));
    if (t[2] >= 0) {
      text += " [";
      for (int64_t k = 0; k < t[2] && k < kMaxSignatureDims; ++k)
        text += (k ? ", " : "") + std::to_string(t[3 + k]);
      text += "]";
    }
  }
  return "(" + text + ")";
}

// Checks one direction of a pair: what `sender` sends (`sent`) against what `receiver` expects.
// `sender_receives` and `receiver_sends`: the other direction's halves are present.
void check_direction(const int64_t* sent, const int64_t* expected, int sender, int receiver,
                     bool sender_receives, bool receiver_sends, const char* what) {
  if (sent[0] == 0 && expected[0] == 0) return;
  if (expected[0] == 0) {
    MYRIAD_CHECK(!receiver_sends || sender_receives, "{}: ranks {} and {} both send to each other",
                 what, sender, receiver);
    MYRIAD_THROW("{}: rank {} sends {} to rank {}, which does not receive from it", what, sender,
                 tensors_text(sent), receiver);
  }
  if (sent[0] == 0) {
    MYRIAD_CHECK(!sender_receives || receiver_sends,
                 "{}: ranks {} and {} both wait to receive from each other", what, sender,
                 receiver);
    MYRIAD_THROW("{}: rank {} waits to receive {} from rank {}, which sends nothing", what,
                 receiver, tensors_text(expected), sender);
  }
  MYRIAD_CHECK(sent[1] == 0,
               "{}: rank {} cannot send {} to rank {}: a tensor that is not contiguous, not on the "
               "communicator's device, of a dtype it cannot move, or of more than {} dimensions",
               what, sender, tensors_text(sent), receiver, kMaxSignatureDims);
  bool agree = sent[2] == expected[2];
  for (int64_t i = 0; agree && i < sent[2]; ++i) {
    agree = slot(sent, i)[0] == 0 || slot(expected, i)[1] < 0 ||
            slot(sent, i)[1] == slot(expected, i)[1];
  }
  MYRIAD_CHECK(agree, "{}: rank {} sends {} to rank {}, which expects {}", what, sender,
               tensors_text(sent), receiver, tensors_text(expected));
}

}  // namespace

std::vector<int64_t> Communicator::agree_with_peer(const std::vector<int64_t>& mine, int peer,
                                                   const char* what) const {
  MYRIAD_CHECK(peer >= 0 && peer < size_ && peer != rank_,
               "{}: rank {} of {} cannot exchange with rank {}", what, rank_, size_, peer);
  std::vector<int64_t> theirs(kP2pWords, 0);
  MYRIAD_CHECK_MPI(MPI_Sendrecv(mine.data(), kP2pWords, MPI_INT64_T, peer, kP2pTag, theirs.data(),
                                kP2pWords, MPI_INT64_T, peer, kP2pTag, control_,
                                MPI_STATUS_IGNORE));
  const bool i_send = mine[kSentHalf] != 0, i_receive = mine[kExpectedHalf] != 0;
  const bool they_send = theirs[kSentHalf] != 0, they_receive = theirs[kExpectedHalf] != 0;
  // Both ranks run the same checks on the same two descriptions, in the same order (the lower
  // rank's sends first), so both raise the same error.
  const auto mine_to_theirs = [&] {
    check_direction(mine.data() + kSentHalf, theirs.data() + kExpectedHalf, rank_, peer, i_receive,
                    they_send, what);
  };
  const auto theirs_to_mine = [&] {
    check_direction(theirs.data() + kSentHalf, mine.data() + kExpectedHalf, peer, rank_,
                    they_receive, i_send, what);
  };
  if (rank_ < peer) {
    mine_to_theirs();
    theirs_to_mine();
  } else {
    theirs_to_mine();
    mine_to_theirs();
  }
  return theirs;
}

std::vector<torch::Tensor> Communicator::point_to_point(
    const std::vector<torch::Tensor>* tensors, const std::vector<torch::ScalarType>* dtypes,
    int peer, const char* what) {
  const WaitScope wait(what, backend(), 2);
  std::vector<int64_t> mine(kP2pWords, 0);
  std::vector<torch::Tensor> sent;
  if (tensors != nullptr) {
    MYRIAD_CHECK(static_cast<int64_t>(tensors->size()) <= kMaxP2pTensors,
                 "{}: {} tensors at once, at most {}", what, tensors->size(), kMaxP2pTensors);
    int64_t* half = mine.data() + kSentHalf;
    half[0] = 1;
    half[2] = static_cast<int64_t>(tensors->size());
    const torch::Device expected = device();
    for (size_t i = 0; i < tensors->size(); ++i) {
      const torch::Tensor& t = (*tensors)[i];
      int64_t* d = slot(half, static_cast<int64_t>(i));
      if (!t.defined()) continue;
      d[0] = 1;
      d[1] = static_cast<int64_t>(t.scalar_type());
      d[2] = t.dim();
      for (int64_t k = 0; k < t.dim() && k < kMaxSignatureDims; ++k) d[3 + k] = t.size(k);
      const bool well_formed = is_communicable_dtype(t.scalar_type()) &&
                               t.device().type() == expected.type() &&
                               (!expected.has_index() || t.device().index() == expected.index()) &&
                               t.is_contiguous() && t.dim() <= kMaxSignatureDims;
      if (!well_formed) half[1] = 1;
      sent.push_back(t);
    }
  }
  if (dtypes != nullptr) {
    MYRIAD_CHECK(static_cast<int64_t>(dtypes->size()) <= kMaxP2pTensors,
                 "{}: {} tensors at once, at most {}", what, dtypes->size(), kMaxP2pTensors);
    int64_t* half = mine.data() + kExpectedHalf;
    half[0] = 1;
    half[2] = static_cast<int64_t>(dtypes->size());
    for (size_t i = 0; i < dtypes->size(); ++i) {
      int64_t* d = slot(half, static_cast<int64_t>(i));
      d[0] = 1;
      d[1] = (*dtypes)[i] == torch::ScalarType::Undefined ? -1 : static_cast<int64_t>((*dtypes)[i]);
      d[2] = -1;
    }
  }
  const std::vector<int64_t> theirs = agree_with_peer(mine, peer, what);
  std::vector<torch::Tensor> received(dtypes != nullptr ? dtypes->size() : 0), defined;
  for (size_t i = 0; i < received.size(); ++i) {
    const int64_t* d = slot(theirs.data() + kSentHalf, static_cast<int64_t>(i));
    if (d[0] == 0) continue;
    received[i] = torch::empty(std::vector<int64_t>(d + 3, d + 3 + d[2]),
                               torch::dtype(static_cast<torch::ScalarType>(d[1])).device(device()));
    defined.push_back(received[i]);
  }
  if (!sent.empty() || !defined.empty()) p2p_impl(sent, defined, peer);
  return received;
}

void Communicator::send(const std::vector<torch::Tensor>& tensors, int peer) {
  point_to_point(&tensors, nullptr, peer, "send");
}

std::vector<torch::Tensor> Communicator::recv(const std::vector<torch::ScalarType>& dtypes,
                                              int peer) {
  return point_to_point(nullptr, &dtypes, peer, "recv");
}

std::vector<torch::Tensor> Communicator::exchange(const std::vector<torch::Tensor>& tensors,
                                                  const std::vector<torch::ScalarType>& dtypes,
                                                  int peer) {
  return point_to_point(&tensors, &dtypes, peer, "exchange");
}

std::vector<int64_t> Communicator::all_gather_counts(int64_t local) const {
  const WaitScope wait("all_gather_counts", "mpi", size_);
  std::vector<int64_t> counts(size_);
  MYRIAD_CHECK_MPI(MPI_Allgather(&local, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, control_));
  return counts;
}

}  // namespace myriad
