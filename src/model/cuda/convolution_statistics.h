#pragma once

// A convolution that also forms its output's per-channel sum and sum of squares: one cuDNN
// operation graph, a forward convolution followed by GenStats, whose engines reduce the output
// tile by tile as they write it. The batch norm that reads the output next then needs no
// statistics pass over it (BatchNormImpl::convolve).
//
// Only in builds with cuDNN's graph API (MYRIAD_WITH_CUDNN_GRAPH). Whether cuDNN has an engine for
// a shape is known only once its graph is built: a shape without one is reported once and takes
// the separate passes.

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "myriad/model/batch_norm.h"

namespace myriad {

// What a graph is built for: x [batch, channels, height, width] and a weight [out_channels,
// channels, kernel, kernel], both channels-last in `dtype` (bfloat16 or float16); one group, no
// dilation, no bias, the same stride and zero padding along both axes.
struct ConvolutionShape {
  int device = 0;
  torch::ScalarType dtype = torch::kBFloat16;
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel = 0, stride = 1, padding = 0;

  int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  bool operator<(const ConvolutionShape& other) const;
  std::string to_string() const;
};

// The convolution's output y (channels-last, x's dtype) and sums [2, out_channels] float32
// (Σ y and Σ y² per channel, over batch, height and width).
struct ConvolutionWithSums {
  torch::Tensor y, sums;
};

class ConvolutionStatisticsPlan;

// The plan of `shape`, built on first use, where cuDNN's engines are timed (as LibTorch times them)
// on that use's x and weight; null where cuDNN has no engine for it, or where its first use falls
// inside a CUDA graph's capture, which cannot build one. Thread-safe.
const ConvolutionStatisticsPlan* convolution_statistics_plan(const ConvolutionShape& shape,
                                                             const torch::Tensor& x,
                                                             const torch::Tensor& weight);

// Runs `plan` on the current stream; x and weight as its shape says.
ConvolutionWithSums run_convolution_statistics(const ConvolutionStatisticsPlan& plan,
                                               const torch::Tensor& x, const torch::Tensor& weight);

// The version of the cuDNN library loaded at run time, as "9.19.0".
std::string loaded_cudnn_version();

}  // namespace myriad
