#include "collective_signature.h"

#include <sstream>

#include "myriad/util/format.h"

namespace myriad {

namespace {

int64_t fnv1a(const void* data, size_t bytes, uint64_t hash = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return static_cast<int64_t>(hash);
}

std::string shape_text(const CollectiveSignature& s) {
  std::ostringstream os;
  os << '[';
  for (int64_t d = 0; d < s.ndim && d < kMaxSignatureDims; ++d) os << (d ? ", " : "") << s.dims[d];
  if (s.ndim > kMaxSignatureDims) os << ", ...";
  os << ']';
  return os.str();
}

std::string device_text(int64_t type, int64_t index) {
  torch::Device device(static_cast<c10::DeviceType>(type),
                       static_cast<c10::DeviceIndex>(index < 0 ? -1 : index));
  return device.str();
}

std::string tensor_text(const CollectiveSignature& s) {
  return str_format("{} {} on {}", c10::toString(static_cast<c10::ScalarType>(s.dtype)),
                    shape_text(s), device_text(s.device_type, s.device_index));
}

}  // namespace

CollectiveSignature describe_call(const char* name, const torch::Tensor& tensor, ShapeRule rule,
                                  int64_t op, int64_t root, const std::vector<int64_t>* counts) {
  CollectiveSignature s;
  s.name_hash = fnv1a(name, std::char_traits<char>::length(name));
  s.shape_rule = static_cast<int64_t>(rule);
  s.dtype = static_cast<int64_t>(tensor.scalar_type());
  s.device_type = static_cast<int64_t>(tensor.device().type());
  s.device_index = tensor.device().has_index() ? tensor.device().index() : -1;
  s.op = op;
  s.root = root;
  s.ndim = tensor.dim();
  for (int64_t d = 0; d < tensor.dim() && d < kMaxSignatureDims; ++d) s.dims[d] = tensor.size(d);
  if (counts != nullptr && !counts->empty()) {
    s.counts_hash = fnv1a(counts->data(), counts->size() * sizeof(int64_t));
  }
  return s;
}

std::string describe_problem(const char* name, int rank, const CollectiveSignature& s,
                             const torch::Device& expected_device) {
  const std::string who = str_format("{}: rank {} passed {}", name, rank, tensor_text(s));
  switch (static_cast<CallProblem>(s.problem)) {
    case CallProblem::kNone:
      return {};
    case CallProblem::kDtype:
      return who +
             ", a dtype no backend moves (use float64, float32, bfloat16, float16, int64, "
             "int32, uint8 or int8)";
    case CallProblem::kDevice:
      return who + str_format(", but this communicator moves tensors on {}", expected_device.str());
    case CallProblem::kNotContiguous:
      return who + ", which is not contiguous (in-place collective)";
    case CallProblem::kTooManyDims:
      return who + str_format(", which has more than {} dimensions", kMaxSignatureDims);
    case CallProblem::kNoRowDim:
      return who + ", a 0-dimensional tensor, which has no rows";
    case CallProblem::kCountsSize:
      return who + ", with a counts list whose length is not the world size";
    case CallProblem::kNegativeCount:
      return who + ", with a negative count";
    case CallProblem::kRowsMismatch:
      return who + str_format(", but its counts entry says {} rows", s.expected_rows);
    case CallProblem::kIndivisible:
      return who + str_format(", whose {} rows do not split evenly over the ranks", s.dims[0]);
    case CallProblem::kRoot:
      return who + str_format(", with root {} outside the world", s.root);
  }
  return who;
}

std::string find_disagreement(const char* name, const std::vector<CollectiveSignature>& all,
                              const torch::Device& expected_device) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].problem != 0)
      return describe_problem(name, static_cast<int>(r), all[r], expected_device);
  }
  const CollectiveSignature& ref = all.front();
  for (size_t r = 1; r < all.size(); ++r) {
    const CollectiveSignature& s = all[r];
    const std::string pair =
        str_format("rank {} passed {}, rank 0 passed {}", r, tensor_text(s), tensor_text(ref));
    if (s.name_hash != ref.name_hash) {
      return str_format("{}: rank {} is in a different collective than rank 0 (calls out of order)",
                        name, r);
    }
    if (s.dtype != ref.dtype) return str_format("{}: dtypes differ: {}", name, pair);
    if (s.device_type != ref.device_type) return str_format("{}: devices differ: {}", name, pair);
    if (s.op != ref.op)
      return str_format("{}: rank {} asked for a different reduction than rank 0", name, r);
    if (s.root != ref.root) {
      return str_format("{}: rank {} named root {}, rank 0 named root {}", name, r, s.root,
                        ref.root);
    }
    if (s.counts_hash != ref.counts_hash) {
      return str_format("{}: rank {} passed different per-rank counts than rank 0", name, r);
    }
    bool same = s.ndim == ref.ndim;
    const int64_t first = ref.shape_rule == static_cast<int64_t>(ShapeRule::kSameRowShape) ? 1 : 0;
    for (int64_t d = first; same && d < ref.ndim && d < kMaxSignatureDims; ++d) {
      same = s.dims[d] == ref.dims[d];
    }
    if (!same) return str_format("{}: shapes differ: {}", name, pair);
  }
  return {};
}

}  // namespace myriad
