#pragma once

#include <torch/torch.h>

#include "myriad/classifier/margin_config.h"

namespace myriad::testing {

// Single-process, unsharded, float64 margin softmax written directly from design §1 with
// LibTorch autograd: the independent reference the sharded classifier is checked against.
struct ReferenceResult {
  torch::Tensor loss;           // scalar
  torch::Tensor grad_features;  // [N, D]
  torch::Tensor grad_weight;    // [C, D]
  torch::Tensor logits;         // [N, C] with the margin applied
};

// `active` (optional) restricts the softmax to those classes (Partial FC); the other rows of
// grad_weight are zero.
ReferenceResult reference_softmax(const torch::Tensor& features, const torch::Tensor& labels,
                                  const torch::Tensor& weight, const MarginConfig& margin,
                                  const torch::Tensor& active = torch::Tensor());

// ||a - b|| / ||b|| in float64.
double relative_error(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace myriad::testing
