#pragma once

// The margin's arithmetic, shared by the CPU path and the CUDA kernels; no LibTorch here so that
// nvcc can include it.

#include <cmath>

#include "myriad/util/host_device.h"

namespace myriad {

struct MarginParams {
  float scale = 64.0f;
  float m1 = 1.0f;
  float m2 = 0.0f;
  float m3 = 0.0f;
  // false for plain softmax: logits are raw dot products and no margin applies.
  bool normalized = true;
  // Backward treats the margin as the identity (d z / d cos = scale on targets too).
  bool straight_through = false;
};

// Below this, sin(theta) is clamped in the exact derivative. float32 cannot represent a cosine
// between 1 - 6e-8 and 1, where sin(theta) would first drop under 3.5e-4, so only cos = +-1
// exactly is affected.
constexpr float kMinSinTheta = 1e-4f;

// The target logit z = s * psi(theta) and dz/dcos, from the target's cosine. psi is the
// monotone extension of cos(m1*theta + m2) - m3 (design §1): with k = floor((m1*theta + m2)/pi),
// psi = (-1)^k cos(m1*theta + m2) - 2k - m3. It equals the plain margin while
// m1*theta + m2 <= pi and keeps decreasing beyond, where cos(theta + m) would turn back up and
// reward a worse angle.
MYRIAD_HD inline void margin_target(float cosine, const MarginParams& p, float* z, float* dz_dcos) {
  if (!p.normalized) {
    *z = cosine;
    *dz_dcos = 1.0f;
    return;
  }
  if (p.m1 == 1.0f && p.m2 == 0.0f) {
    *z = p.scale * (fminf(1.0f, fmaxf(-1.0f, cosine)) - p.m3);
    *dz_dcos = p.scale;
    return;
  }
  const float kPi = 3.14159265358979f;
  const float c = fminf(1.0f, fmaxf(-1.0f, cosine));
  const float theta = acosf(c);
  const float phi = p.m1 * theta + p.m2;
  const float k = floorf(phi / kPi);
  const float sign = fmodf(k, 2.0f) == 0.0f ? 1.0f : -1.0f;
  *z = p.scale * (sign * cosf(phi) - 2.0f * k - p.m3);
  if (p.straight_through) {
    *dz_dcos = p.scale;
  } else {
    const float sin_theta = fmaxf(sqrtf(fmaxf(0.0f, 1.0f - c * c)), kMinSinTheta);
    *dz_dcos = p.scale * sign * p.m1 * sinf(phi) / sin_theta;
  }
}

// Logit of a non-target class.
MYRIAD_HD inline float margin_other(float cosine, const MarginParams& p) {
  return p.normalized ? p.scale * fminf(1.0f, fmaxf(-1.0f, cosine)) : cosine;
}

}  // namespace myriad
