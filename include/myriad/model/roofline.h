#pragma once

// Where a training step of a network should spend its time: each operation's FLOPs and the least
// bytes it must move, read from the autograd graph of one forward pass, and the floor these set at
// a device's measured matrix rate and memory bandwidth (a roofline per layer kind).

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// What a device can do at best: its dense matrix-product rate and its memory bandwidth, both
// measured (myriad-bench measures them before each benchmark).
struct Ceilings {
  double gemm_tflops = 0;       // 1e12 floating-point operations per second
  double memory_bandwidth = 0;  // bytes read plus written per second
};

// The kinds a step's kernels are summed into, by scripts/profile-step.sh too.
enum class LayerKind { kConvolution, kBatchNormPrelu, kAdd, kGemm, kCast, kOther };
const char* to_string(LayerKind kind);
const std::vector<LayerKind>& layer_kinds();

// One operation of the forward pass with its backward.
struct LayerCost {
  std::string op;  // the autograd node's name: "ConvolutionBackward0"
  LayerKind kind = LayerKind::kOther;
  double flops = 0;  // matrix-product FLOPs, forward plus backward
  double bytes = 0;  // the least bytes read and written, forward plus backward
};

// Every operation of the autograd graph that ends at `output`, each once, views left out (they
// move no bytes). Counting rules, per operation (a tensor's size in bytes: its elements times its
// dtype's size; input gradients are formed only for inputs that require them):
//   - convolution and matrix product: 2 x multiply-adds forward, twice that backward (the input's
//     and the weight's gradients); the input, weight and output each pass 3 times (read forward,
//     then the backward's two products);
//   - batch norm and PReLU (fused or not): no matrix FLOPs; the first input is read forward and
//     again backward, the output written forward, its gradient read and the first input's gradient
//     written backward; the other inputs (parameters, a residual added in the same pass) are read
//     once: their gradients are per-channel sums or the output's own;
//   - every other operation: the same, with every input as the first;
//   - additions and dtype casts: the inputs and the output pass twice (forward, and the gradient
//     passed back, summed where branches meet).
// Inputs that require no gradient (the images) are not visible in the graph and are not counted.
// The graph must be built with activation checkpointing off: a checkpointed block is one node.
std::vector<LayerCost> layer_census(const torch::Tensor& output);

// The census of one kind, summed, set against the ceilings.
struct KindFloor {
  LayerKind kind = LayerKind::kOther;
  int64_t layers = 0;
  double flops = 0, bytes = 0;
  double compute_seconds = 0;  // flops at the matrix rate
  double memory_seconds = 0;   // bytes at the bandwidth
  double floor_seconds = 0;    // the sum over its layers of the larger of the two
};

// One row per kind of layer_kinds() (kinds without layers included, with zeros).
std::vector<KindFloor> roofline(const std::vector<LayerCost>& census, const Ceilings& ceilings);
// The step's floor: the sum of the kinds' floors.
double floor_seconds(const std::vector<KindFloor>& kinds);

}  // namespace myriad
