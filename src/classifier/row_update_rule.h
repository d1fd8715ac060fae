#pragma once

// The optimizer's arithmetic on one row and its elements, one rule for the GPU's row kernels
// (cuda/weight_kernels.cu), the fused weight update (cuda/hopper) and the CPU's row loop
// (cpu_row_update.cpp). No LibTorch here so that nvcc can include it.

#include <cmath>
#include <cstdint>

#include "myriad/classifier/row_gradient.h"
#include "myriad/util/host_device.h"

namespace myriad {

constexpr float kMinSquaredNorm = 1e-24f;

struct SgdArgs {
  float lr;
  float momentum;
  float weight_decay;
  bool nesterov;
  const float* grad_multiplier;  // undoes loss scaling: one float beside the weights; null for 1
};

struct AdamWArgs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
  const float* grad_multiplier;
};

// a b + c: one rounding on the GPU; two on the CPU, where the baseline x86-64 has no FMA
// instruction and std::fma would be a library call per element.
MYRIAD_HD inline float multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

MYRIAD_HD inline float square_root(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

MYRIAD_HD inline float inverse_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return rsqrtf(x);
#else
  return 1.0f / std::sqrt(x);
#endif
}

// 1/|w| from the sum of the row's squares, at most 1e12: forward's row norms and the update's.
MYRIAD_HD inline float inverse_norm(float squares) {
  return inverse_sqrt(squares > kMinSquaredNorm ? squares : kMinSquaredNorm);
}

// dw for one element: the gradient with respect to the row itself. For grad = dL/d(w/|w|),
// dw = grad/|w| - (w.grad) w/|w|^3; for grad = dL/d(w/|w|) / |w|, dw = grad - (w.grad) w/|w|^2.
struct RowGradientOf {
  float gain = 1.0f;    // of grad: the multiplier that undoes loss scaling, times 1/|w| or 1
  float radial = 0.0f;  // of w

  MYRIAD_HD float operator()(float w, float g) const { return multiply_add(g, gain, -radial * w); }
};

// The row's RowGradientOf from the sums over its elements of w.grad (`dot`) and w^2 (`squares`);
// `multiplier` undoes loss scaling (1 when null).
MYRIAD_HD inline RowGradientOf row_gradient_of(float dot, float squares, RowGradient grad_of,
                                               const float* multiplier) {
  RowGradientOf rg;
  if (multiplier != nullptr) rg.gain = *multiplier;
  if (grad_of == RowGradient::kRow) return rg;
  dot *= rg.gain;
  const float inv_norm = inverse_norm(squares);
  if (grad_of == RowGradient::kUnitRow) {
    rg.gain *= inv_norm;
    rg.radial = dot * inv_norm * inv_norm * inv_norm;
  } else {
    rg.radial = dot * inv_norm * inv_norm;
  }
  return rg;
}

// SGD on one element w with gradient g (as torch.optim.SGD: weight decay added to the gradient,
// then momentum `b`, when the row has a buffer, and Nesterov); returns the new w. kNesterov as a
// constant spares the fused update computing both forms and selecting one.
template <bool kNesterov>
MYRIAD_HD inline float sgd_element(float w, float g, const RowGradientOf& dw, const SgdArgs& args,
                                   float* b) {
  float d = multiply_add(g, dw.gain, (args.weight_decay - dw.radial) * w);
  if (b != nullptr) {
    *b = multiply_add(args.momentum, *b, d);
    d = kNesterov ? multiply_add(args.momentum, *b, d) : *b;
  }
  return multiply_add(-args.lr, d, w);
}
MYRIAD_HD inline float sgd_element(float w, float g, const RowGradientOf& dw, const SgdArgs& args,
                                   float* b) {
  return args.nesterov ? sgd_element<true>(w, g, dw, args, b)
                       : sgd_element<false>(w, g, dw, args, b);
}

// AdamW's step size and 1/sqrt of its second bias correction, taken once per row.
struct AdamWStep {
  float step, inv_sqrt_bc2;
};

MYRIAD_HD inline AdamWStep adamw_step(const AdamWArgs& args) {
  return {args.lr / args.bias_correction1, inverse_sqrt(args.bias_correction2)};
}

// AdamW on one element w with the row's gradient dw_k, moments m and v updated in place; returns
// the new w.
MYRIAD_HD inline float adamw_element(float w, float dw_k, float* m, float* v, const AdamWArgs& args,
                                     const AdamWStep& s) {
  *m = args.beta1 * *m + (1.0f - args.beta1) * dw_k;
  *v = args.beta2 * *v + (1.0f - args.beta2) * dw_k * dw_k;
  return w * (1.0f - args.lr * args.weight_decay) -
         s.step * *m / (square_root(*v) * s.inv_sqrt_bc2 + args.eps);
}

}  // namespace myriad
