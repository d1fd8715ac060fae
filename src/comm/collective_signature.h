#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// What one rank is about to do in a collective, in a fixed-size form that MPI can gather, so
// that all ranks can check they are about to make the same call before any data moves.
enum class ShapeRule : int64_t {
  kSameShape,    // every rank passes the same full shape
  kSameRowShape  // dims 1.. agree; dim 0 is governed by per-rank counts
};

enum class CallProblem : int64_t {
  kNone = 0,
  kDtype,
  kDevice,
  kNotContiguous,
  kTooManyDims,
  kNoRowDim,
  kCountsSize,
  kNegativeCount,
  kRowsMismatch,
  kIndivisible,
  kRoot,
};

constexpr int kMaxSignatureDims = 8;

struct CollectiveSignature {
  int64_t problem = 0;
  int64_t shape_rule = 0;
  int64_t dtype = 0;
  int64_t device_type = 0;
  int64_t device_index = 0;
  int64_t op = 0;
  int64_t root = 0;
  int64_t counts_hash = 0;
  int64_t ndim = 0;
  int64_t dims[kMaxSignatureDims] = {0};
  int64_t expected_rows = 0;  // for kRowsMismatch / kIndivisible messages
  int64_t name_hash = 0;      // which collective: different collectives never agree
};

// Fills everything except `problem`, which the caller decides.
CollectiveSignature describe_call(const char* name, const torch::Tensor& tensor, ShapeRule rule,
                                  int64_t op, int64_t root, const std::vector<int64_t>* counts);

// Empty when every rank's signature is valid and agrees with rank 0's; otherwise a message
// naming the first offending rank and what differs. Pure: every rank computes the same text.
std::string find_disagreement(const char* name, const std::vector<CollectiveSignature>& all,
                              const torch::Device& expected_device);

// Text for one rank's local problem, also used when cross-rank checks are off.
std::string describe_problem(const char* name, int rank, const CollectiveSignature& sig,
                             const torch::Device& expected_device);

}  // namespace myriad
