#pragma once

#include <torch/torch.h>

#include <unordered_map>
#include <vector>

namespace myriad {

// Autocast casts each float32 weight on its own, and its gradient back on its own: two small
// launches per convolution and step. A WeightCasts casts a group of weights in one gather and one
// cast, and their gradients come back in one gather and one cast, with the same values and the
// weights' layouts. While it lives, convolutions on this thread (BatchNormImpl::convolve) take its
// copies through copy_of.
class WeightCasts {
 public:
  // Copies in `dtype` (bfloat16 or float16).
  explicit WeightCasts(torch::ScalarType dtype);
  ~WeightCasts();
  WeightCasts(const WeightCasts&) = delete;
  WeightCasts& operator=(const WeightCasts&) = delete;

  // Casts `weights` as one group. A weight that cannot join keeps autocast's cast: not float32,
  // not dense in the default or the channels-last layout, or a size that would leave the next
  // copy off a 128-byte boundary.
  void cast(const std::vector<torch::Tensor>& weights);
  // How many weights this holds copies of.
  size_t size() const { return copies_.size(); }

  // The copy of `weight` in `dtype` that a live WeightCasts on this thread made, or an undefined
  // tensor.
  static torch::Tensor copy_of(const torch::Tensor& weight, torch::ScalarType dtype);

 private:
  torch::ScalarType dtype_;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> copies_;
  WeightCasts* outer_;
};

}  // namespace myriad
