// The fused kernels (forward statistics, logits' gradient, and the gradient from kept
// exponentials) against a float64 reference on the same bf16 inputs (shapes that leave partial
// tiles of samples, classes and K), then their time beside cuBLAS's logits GEMM.
//   fused_softmax_check [check|time]

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../src/classifier/cuda/hopper/fused_softmax.h"
#include "check_support.cuh"

using myriad::MarginParams;

using myriad::testing::time_ms;

namespace {

struct Problem {
  int64_t batch, classes;
  int dim;
  std::vector<__nv_bfloat16> x, w;
  std::vector<float> scale;
  std::vector<int64_t> target;
  int64_t begin;
};

// Features of norm `length` (about: rounded to bf16), class rows of about 0.05 per element.
Problem make_problem(int64_t batch, int64_t classes, int dim, uint64_t seed, bool fill_w = true,
                     double length = 1.0) {
  Problem p{batch, classes, dim, {}, {}, {}, {}, 1000};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  p.x.resize(batch * dim);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<float> v(dim);
    double norm = 0;
    for (float& e : v) e = normal(rng), norm += double(e) * e;
    for (int k = 0; k < dim; ++k)
      p.x[b * dim + k] = __float2bfloat16(float(length * v[k] / std::sqrt(norm)));
  }
  p.w.resize(classes * dim);
  p.scale.resize(classes);
  if (fill_w) {
    for (int64_t j = 0; j < classes; ++j) {
      double norm = 0;
      for (int k = 0; k < dim; ++k) {
        const __nv_bfloat16 e = __float2bfloat16(normal(rng) * 0.05f);
        p.w[j * dim + k] = e;
        norm += double(__bfloat162float(e)) * __bfloat162float(e);
      }
      p.scale[j] = float(1.0 / std::sqrt(norm));
    }
  }
  p.target.resize(batch);
  std::uniform_int_distribution<int64_t> cls(0, classes - 1);
  // Every tenth sample's class lies on another shard, and another tenth's just past this
  // chunk's last class (where the last tile's padding would catch it).
  for (int64_t b = 0; b < batch; ++b)
    p.target[b] = b % 10 == 3 ? -7 : b % 10 == 7 ? p.begin + classes + b % 3 : p.begin + cls(rng);
  return p;
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// float64 dot products of the same bf16 values, [batch, classes], rows shared among threads (a
// check with 30 tiles per CTA at D = 512 is tens of billions of products).
std::vector<double> reference_dots(const Problem& p) {
  std::vector<float> w(p.w.size());
  for (size_t e = 0; e < w.size(); ++e) w[e] = __bfloat162float(p.w[e]);
  std::vector<double> dots(p.batch * p.classes);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<double> xb(p.dim);
      for (int64_t b = t; b < p.batch; b += threads) {
        for (int k = 0; k < p.dim; ++k) xb[k] = __bfloat162float(p.x[b * p.dim + k]);
        for (int64_t j = 0; j < p.classes; ++j) {
          const float* wj = &w[j * p.dim];
          double dot = 0;
          for (int k = 0; k < p.dim; ++k) dot += xb[k] * wj[k];
          dots[b * p.classes + j] = dot;
        }
      }
    });
  for (std::thread& th : pool) th.join();
  return dots;
}

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

template <class T>
T* device_nan(size_t n) {  // NaN (all bits set) wherever nothing is written
  T* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(T)));
  CHECK(cudaMemset(d, 0xff, n * sizeof(T)));
  return d;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The inputs of one problem on the device, with each sample's reference, the bound on its logits
// against which the exponentials are kept (s for a normalising margin), and the first sample's on
// the host.
struct Operands {
  const __nv_bfloat16 *x, *w;
  const float* scale;
  const int64_t* target;
  int64_t begin, batch, classes;
  int dim;
  MarginParams params;
  const float* reference;
  float first_reference;
};

// Plain softmax's reference per sample, |x_b| max_j |w_j|, from the same bf16 values.
std::vector<float> logit_bounds(const Problem& p) {
  double widest = 0;
  for (int64_t j = 0; j < p.classes; ++j) {
    double norm = 0;
    for (int k = 0; k < p.dim; ++k)
      norm += std::pow(double(__bfloat162float(p.w[j * p.dim + k])), 2);
    widest = std::max(widest, std::sqrt(norm));
  }
  std::vector<float> bound(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    double norm = 0;
    for (int k = 0; k < p.dim; ++k)
      norm += std::pow(double(__bfloat162float(p.x[b * p.dim + k])), 2);
    bound[b] = float(std::sqrt(norm) * widest);
  }
  return bound;
}

// Forward's statistics by part, read back: NaN wherever nothing was written.
struct PartStats {
  std::vector<float> max, sum, target;
};

PartStats forward_stats(const Operands& o, int parts) {
  const size_t part_rows = size_t(parts) * o.batch;
  float *max = device_nan<float>(part_rows), *sum = device_nan<float>(part_rows);
  float* target = device_nan<float>(o.batch);
  CHECK(myriad::cuda::fused_logit_stats(o.x, o.batch, o.w, o.scale, o.classes, o.dim, o.target,
                                        o.begin, o.params, max, sum, target, nullptr, nullptr,
                                        nullptr, nullptr));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  PartStats out{to_host(max, part_rows), to_host(sum, part_rows), to_host(target, o.batch)};
  cudaFree(max), cudaFree(sum), cudaFree(target);
  return out;
}

// The reference: the logits z [batch, classes] from float64 dot products of the same bf16 values
// with the margin in float32, as the kernels compute it; each sample's max and sum of exp(z - max).
struct Reference {
  std::vector<double> z, max, sum;
};

Reference reference_stats(const Problem& p, const std::vector<double>& dots, MarginParams params,
                          bool scaled) {
  Reference r{std::vector<double>(p.batch * p.classes), std::vector<double>(p.batch),
              std::vector<double>(p.batch)};
  for (int64_t b = 0; b < p.batch; ++b) {
    double m = -INFINITY;
    double* z = &r.z[b * p.classes];
    for (int64_t j = 0; j < p.classes; ++j) {
      const float cosine = float(dots[b * p.classes + j]) * (scaled ? p.scale[j] : 1.0f);
      float zf, unused;
      if (j == p.target[b] - p.begin)
        myriad::margin_target(cosine, params, &zf, &unused);
      else
        zf = myriad::margin_other(cosine, params);
      z[j] = zf;
      m = std::max(m, z[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < p.classes; ++j) sum += std::exp(z[j] - m);
    r.max[b] = m;
    r.sum[b] = sum;
  }
  return r;
}

// The worst errors of forward's statistics, its parts combined as the classifier combines them,
// in float64; targets written for samples whose class lies outside the chunk.
struct StatsErrors {
  double max = 0, sum = 0, target = 0;
  int stray_targets = 0;
};

StatsErrors stats_errors(const Problem& p, int parts, const PartStats& got, const Reference& ref) {
  StatsErrors e;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t tj = p.target[b] - p.begin;
    if (tj >= 0 && tj < p.classes)
      e.target = std::max(e.target, double(std::fabs(got.target[b] - ref.z[b * p.classes + tj])));
    else if (!std::isnan(got.target[b]))
      ++e.stray_targets;
    double gm = -INFINITY, gs = 0;
    for (int q = 0; q < parts; ++q) gm = std::max(gm, double(got.max[q * p.batch + b]));
    for (int q = 0; q < parts; ++q)
      gs += got.sum[q * p.batch + b] * std::exp(double(got.max[q * p.batch + b]) - gm);
    // NaN (an unwritten part) fails both comparisons.
    e.max = std::isnan(gm) ? INFINITY : std::max(e.max, std::fabs(gm - ref.max[b]));
    e.sum = std::isnan(gs) ? INFINITY : std::max(e.sum, std::fabs(gs - ref.sum[b]) / ref.sum[b]);
  }
  return e;
}

// The logits' gradient, class-major [classes, batch], from the given statistics:
// coef (softmax - one-hot) dz/dcos / |w_j|; `largest` receives its largest magnitude.
std::vector<double> reference_grad(const Problem& p, const std::vector<double>& dots,
                                   const std::vector<double>& z, const std::vector<float>& row_max,
                                   const std::vector<float>& row_inv_sum, float coef,
                                   MarginParams params, bool scaled, double* largest) {
  std::vector<double> grad(p.classes * p.batch);
  *largest = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t j = 0; j < p.classes; ++j) {
      const double dot_scale = scaled ? p.scale[j] : 1.0;
      const bool target = j == p.target[b] - p.begin;
      float zf, dz = params.normalized ? params.scale : 1.0f;
      if (target)
        myriad::margin_target(float(dots[b * p.classes + j] * dot_scale), params, &zf, &dz);
      const double softmax = std::exp(z[b * p.classes + j] - row_max[b]) * row_inv_sum[b];
      const double g = coef * (softmax - (target ? 1.0 : 0.0)) * dz * dot_scale;
      grad[j * p.batch + b] = g;
      *largest = std::max(*largest, std::fabs(g));
    }
  return grad;
}

// The worst error of a bf16 gradient (times each sample's factor, where given) against the
// reference: 2^-9 relative, and exp's error on z's; elements far below the largest count against
// a floor of 1e-3 of it. NaN anywhere is infinitely wrong.
double gradient_error(const std::vector<__nv_bfloat16>& got, const std::vector<float>& factor,
                      int64_t batch, const std::vector<double>& ref, double largest) {
  double worst = 0;
  for (size_t e = 0; e < ref.size(); ++e) {
    const double g =
        double(__bfloat162float(got[e])) * (factor.empty() ? 1.0 : double(factor[e % batch]));
    const double err = std::fabs(g - ref[e]) / (std::fabs(ref[e]) + 1e-3 * largest);
    worst = std::isnan(g) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

// Backward from the kept exponentials as the classifier runs it: kept_finish, then the gradient
// kernel gated on its depth flag. Returns the factors; `deep` and the matrix are left on the
// device.
std::vector<float> finish_backward(const Operands& o, __nv_bfloat16* kept, const float* tcos,
                                   const float* row_max, const float* row_inv_sum,
                                   const float* coef, int* deep) {
  float* factor = device_nan<float>(o.batch);
  CHECK(myriad::cuda::kept_finish(kept, o.batch, o.classes, o.scale, o.target, o.begin, tcos,
                                  row_max, row_inv_sum, coef, o.reference, o.params, factor, deep,
                                  nullptr));
  CHECK(myriad::cuda::fused_logit_grad(o.x, o.batch, o.w, o.scale, o.classes, o.dim, o.target,
                                       o.begin, row_max, row_inv_sum, coef, o.params, kept, deep,
                                       nullptr));
  CHECK(cudaDeviceSynchronize());
  std::vector<float> f = to_host(factor, o.batch);
  cudaFree(factor);
  return f;
}

struct KeptOutcome {
  double worst = 0;      // the gradient from the kept exponentials against float64
  std::string problems;  // what else failed, for the report
};

// A row deeper than kKeptMaxDepth below its reference (the first sample's max made so) raises the
// flag: every
// factor is 1 and the gated kernel writes, bit for bit, what the ungated one does.
std::string deep_fallback(const Operands& o, __nv_bfloat16* kept, const float* tcos,
                          const float* row_max, const float* row_inv_sum, const float* coef) {
  std::vector<float> deeper = to_host(row_max, o.batch);
  deeper[0] = o.first_reference - myriad::kKeptMaxDepth - 1.0f;
  float* d_deeper = to_device(deeper);
  int* deep = device_nan<int>(1);
  const std::vector<float> factor =
      finish_backward(o, kept, tcos, d_deeper, row_inv_sum, coef, deep);
  __nv_bfloat16* grad = device_nan<__nv_bfloat16>(o.classes * o.batch);
  CHECK(myriad::cuda::fused_logit_grad(o.x, o.batch, o.w, o.scale, o.classes, o.dim, o.target,
                                       o.begin, d_deeper, row_inv_sum, coef, o.params, grad,
                                       nullptr, nullptr));
  CHECK(cudaDeviceSynchronize());
  std::string problems;
  if (to_host(deep, 1)[0] != 1) problems += " (a deep row raised no flag)";
  if (std::any_of(factor.begin(), factor.end(), [](float f) { return f != 1.0f; }))
    problems += " (a deep row left factors other than 1)";
  if (!same_bits(to_host(kept, o.classes * o.batch), to_host(grad, o.classes * o.batch)))
    problems += " (the deep-row fallback differs from the gradient kernel)";
  cudaFree(d_deeper), cudaFree(deep), cudaFree(grad);
  return problems;
}

// A zero upstream gradient: every factor 0 and every target's element 0, not 0/0.
std::string zero_gradient(const Operands& o, __nv_bfloat16* kept, const float* tcos,
                          const float* row_max, const float* row_inv_sum) {
  float* zero = to_device(std::vector<float>{0.0f});
  int* deep = device_nan<int>(1);
  const std::vector<float> factor =
      finish_backward(o, kept, tcos, row_max, row_inv_sum, zero, deep);
  const std::vector<__nv_bfloat16> matrix = to_host(kept, o.classes * o.batch);
  cudaFree(zero), cudaFree(deep);
  // The logits' gradient is each element times its sample's factor: 0 everywhere, where 0/0 at
  // a target would give NaN.
  for (size_t e = 0; e < matrix.size(); ++e)
    if (double(__bfloat162float(matrix[e])) * factor[e % o.batch] != 0.0)
      return " (a zero upstream gradient gave a gradient other than 0)";
  return "";
}

// Forward keeping the exponentials gives the same statistics bit for bit; backward from them, the
// reference's gradient; then the deep-row fallback and a zero upstream gradient.
KeptOutcome check_kept(const Operands& o, int parts, const PartStats& got, const float* row_max,
                       const float* row_inv_sum, const float* coef,
                       const std::vector<double>& ref_grad, double largest) {
  const size_t part_rows = size_t(parts) * o.batch;
  __nv_bfloat16* kept = device_nan<__nv_bfloat16>(o.classes * o.batch);
  float *kmax = device_nan<float>(part_rows), *ksum = device_nan<float>(part_rows);
  float *kt = device_nan<float>(o.batch), *tcos = device_nan<float>(o.batch);
  CHECK(myriad::cuda::fused_logit_stats(o.x, o.batch, o.w, o.scale, o.classes, o.dim, o.target,
                                        o.begin, o.params, kmax, ksum, kt, tcos, kept, o.reference,
                                        nullptr));
  KeptOutcome out;
  CHECK(cudaDeviceSynchronize());
  if (!same_bits(to_host(kmax, part_rows), got.max) ||
      !same_bits(to_host(ksum, part_rows), got.sum) || !same_bits(to_host(kt, o.batch), got.target))
    out.problems += " (statistics differ when keeping them)";
  const std::vector<__nv_bfloat16> forward = to_host(kept, o.classes * o.batch);
  int* deep = device_nan<int>(1);
  const std::vector<float> factor =
      finish_backward(o, kept, tcos, row_max, row_inv_sum, coef, deep);
  if (to_host(deep, 1)[0] != 0)
    out.problems += " (rows within reach of their reference raised the flag)";
  out.worst =
      gradient_error(to_host(kept, o.classes * o.batch), factor, o.batch, ref_grad, largest);
  // Each later case starts from forward's matrix again.
  const auto restore = [&] {
    CHECK(cudaMemcpy(kept, forward.data(), forward.size() * 2, cudaMemcpyHostToDevice));
  };
  restore();
  out.problems += deep_fallback(o, kept, tcos, row_max, row_inv_sum, coef);
  restore();
  out.problems += zero_gradient(o, kept, tcos, row_max, row_inv_sum);
  cudaFree(kept), cudaFree(kmax), cudaFree(ksum), cudaFree(kt), cudaFree(tcos), cudaFree(deep);
  return out;
}

int check(int64_t batch, int64_t classes, int dim, MarginParams params, bool scaled) {
  // Plain softmax's logits are not cosines: features of norm 16 give them a range to keep.
  const Problem p =
      make_problem(batch, classes, dim, 17 + batch + classes, true, params.normalized ? 1.0 : 16.0);
  const int parts = myriad::cuda::fused_logit_parts(0, batch, classes);
  auto* x = to_device(p.x);
  auto* w = to_device(p.w);
  float* scale = scaled ? to_device(p.scale) : nullptr;
  int64_t* target = to_device(p.target);
  const std::vector<float> bounds =
      params.normalized ? std::vector<float>(batch, params.scale) : logit_bounds(p);
  float* reference = to_device(bounds);
  const Operands ops{x,       w,   scale,  target,    p.begin,  batch,
                     classes, dim, params, reference, bounds[0]};
  const PartStats got = forward_stats(ops, parts);
  const std::vector<double> dots = reference_dots(p);
  const Reference ref = reference_stats(p, dots, params, scaled);
  const StatsErrors errors = stats_errors(p, parts, got, ref);
  // The gradient from the reference's statistics as float32, what the all-reduce delivers.
  std::vector<float> row_max(batch), row_inv_sum(batch);
  for (int64_t b = 0; b < batch; ++b)
    row_max[b] = float(ref.max[b]), row_inv_sum[b] = float(1 / ref.sum[b]);
  const float coef = 3.7f / float(batch);
  double largest = 0;
  const std::vector<double> ref_grad =
      reference_grad(p, dots, ref.z, row_max, row_inv_sum, coef, params, scaled, &largest);
  float* d_max = to_device(row_max);
  float* d_inv = to_device(row_inv_sum);
  float* d_coef = to_device(std::vector<float>{coef});
  __nv_bfloat16* grad = device_nan<__nv_bfloat16>(classes * batch);
  CHECK(myriad::cuda::fused_logit_grad(x, batch, w, scale, classes, dim, target, p.begin, d_max,
                                       d_inv, d_coef, params, grad, nullptr, nullptr));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const double worst_grad =
      gradient_error(to_host(grad, classes * batch), {}, batch, ref_grad, largest);
  // Forward again, keeping the exponentials, and backward as the classifier runs it.
  const KeptOutcome kept = check_kept(ops, parts, got, d_max, d_inv, d_coef, ref_grad, largest);
  cudaFree(d_max), cudaFree(d_inv), cudaFree(d_coef), cudaFree(grad);
  // bf16 products summed in float32 against float64: cosines within about 1e-6, so z = 64 cos
  // within 1e-4 (measured: 1.5e-5); the gradient within bf16's rounding, 2^-8 relative.
  const bool ok = errors.max < 2e-4 && errors.sum < 2e-4 && errors.target < 2e-4 &&
                  errors.stray_targets == 0 && worst_grad < 6e-3 && kept.worst < 6e-3 &&
                  kept.problems.empty();
  std::printf(
      "check batch %lld classes %lld dim %d parts %d (m2 %.2f m3 %.2f%s%s): worst |max| "
      "%.2e, sum rel %.2e, target %.2e, stray targets %d, gradient %.2e, from kept "
      "exponentials %.2e%s: %s\n",
      (long long)batch, (long long)classes, dim, parts, params.m2, params.m3,
      params.normalized ? "" : ", plain", scaled ? ", row scales" : "", errors.max, errors.sum,
      errors.target, errors.stray_targets, worst_grad, kept.worst, kept.problems.c_str(),
      ok ? "ok" : "FAILED");
  cudaFree(x), cudaFree(w), cudaFree(scale), cudaFree(target), cudaFree(reference);
  return ok ? 0 : 1;
}

// Pseudo-random bf16 weights in (-0.05, 0.05), filled on the device: constant or zero inputs
// would time faster than real ones.
__global__ void fill_random(__nv_bfloat16* w, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    w[i] = __float2bfloat16((float((h >> 40) & 0xFFFF) / 65536.0f - 0.5f) * 0.1f);
  }
}

void time_case(int64_t batch, int64_t classes, int dim) {
  Problem p = make_problem(batch, 1, dim, 5, false);
  __nv_bfloat16 *x = to_device(p.x), *w;
  CHECK(cudaMalloc(&w, classes * dim * 2));
  fill_random<<<1024, 256>>>(w, classes * dim);
  CHECK(cudaGetLastError());
  std::vector<int64_t> target(batch);
  for (int64_t b = 0; b < batch; ++b) target[b] = p.begin + (b * 7919) % classes;
  int64_t* t = to_device(target);
  const int64_t parts = myriad::cuda::fused_logit_parts(0, batch, classes);
  float *gmax, *gsum, *tl;
  CHECK(cudaMalloc(&gmax, parts * batch * 4));
  CHECK(cudaMalloc(&gsum, parts * batch * 4));
  CHECK(cudaMalloc(&tl, batch * 4));
  MarginParams params;
  params.m2 = 0.5f;
  const float fused = time_ms(
      [&] {
        CHECK(myriad::cuda::fused_logit_stats(x, batch, w, nullptr, classes, dim, t, p.begin,
                                              params, gmax, gsum, tl, nullptr, nullptr, nullptr,
                                              nullptr));
      },
      10);
  std::vector<float> ones(batch, 1.0f);
  float* row_max = to_device(ones);
  float* inv_sum = to_device(ones);
  float* coef = to_device(std::vector<float>{1.0f / float(batch)});
  __nv_bfloat16* grad;
  CHECK(cudaMalloc(&grad, classes * batch * 2));
  const float fused_grad = time_ms(
      [&] {
        CHECK(myriad::cuda::fused_logit_grad(x, batch, w, nullptr, classes, dim, t, p.begin,
                                             row_max, inv_sum, coef, params, grad, nullptr,
                                             nullptr));
      },
      10);
  // Forward keeping the exponentials (into the gradient's buffer), and backward's finish with its
  // gated gradient kernel, as the classifier runs them.
  float* tcos;
  int* deep;
  CHECK(cudaMalloc(&tcos, batch * 4));
  CHECK(cudaMalloc(&deep, 4));
  float* reference = to_device(std::vector<float>(batch, params.scale));
  const float keep = time_ms(
      [&] {
        CHECK(myriad::cuda::fused_logit_stats(x, batch, w, nullptr, classes, dim, t, p.begin,
                                              params, gmax, gsum, tl, tcos, grad, reference,
                                              nullptr));
      },
      10);
  const float finish = time_ms(
      [&] {
        CHECK(myriad::cuda::kept_finish(grad, batch, classes, nullptr, t, p.begin, tcos, row_max,
                                        inv_sum, coef, reference, params, tl, deep, nullptr));
        CHECK(myriad::cuda::fused_logit_grad(x, batch, w, nullptr, classes, dim, t, p.begin,
                                             row_max, inv_sum, coef, params, grad, deep, nullptr));
      },
      10);
  cudaFree(row_max), cudaFree(inv_sum), cudaFree(coef), cudaFree(grad), cudaFree(tcos),
      cudaFree(deep), cudaFree(reference);
  // cuBLAS: the logits of a chunk of 1M classes as today's path computes them (bf16 in, float32
  // out, class-major), scaled to all classes.
  const int64_t chunk = std::min<int64_t>(classes, 1 << 20);
  float* logits;
  CHECK(cudaMalloc(&logits, chunk * batch * 4));
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1, zero = 0;
  const float gemm =
      time_ms(
          [&] {
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(batch), int(chunk), dim, &one, x,
                         CUDA_R_16BF, dim, w, CUDA_R_16BF, dim, &zero, logits, CUDA_R_32F,
                         int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          },
          10) *
      double(classes) / chunk;
  const double flop = 2.0 * batch * classes * dim;
  std::printf(
      "time batch %lld classes %lld dim %d: statistics %.3f ms (%.0f TFLOP/s), gradient "
      "%.3f ms (%.0f TFLOP/s), statistics keeping the exponentials %.3f ms and backward's "
      "finish %.3f ms, cuBLAS logits GEMM alone %.3f ms (%.0f TFLOP/s)\n",
      (long long)batch, (long long)classes, dim, fused, flop / fused / 1e9, fused_grad,
      flop / fused_grad / 1e9, keep, finish, gemm, flop / gemm / 1e9);
  cublasDestroy(h);
  cudaFree(logits), cudaFree(x), cudaFree(w), cudaFree(t), cudaFree(gmax), cudaFree(gsum),
      cudaFree(tl);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = myriad::testing::mode_on_hopper(argc, argv);
  if (mode == "check") {
    MarginParams arc;
    arc.m2 = 0.5f;
    MarginParams cos;
    cos.m3 = 0.35f;
    MarginParams plain;
    plain.normalized = false;
    int failed = 0;
    failed += check(200, 3000, 512, arc, true);
    failed += check(128, 1024, 512, cos, false);
    failed += check(77, 700, 136, arc, true);
    failed += check(300, 2500, 256, plain, false);
    failed += check(140, 40000, 128, arc, true);  // several tiles per part
    failed += check(64, 200000, 64, cos, true);   // a dozen tiles per part
    // 30 and more tiles per CTA at the largest D: the weight ring wraps many times.
    failed += check(256, 280000, 512, arc, true);
    // Many row blocks (8 and 16 CTAs share each lane's tiles), odd tiles per lane, a partial last
    // row block.
    failed += check(1024, 30000, 256, cos, false);
    failed += check(2000, 9000, 512, arc, true);
    // A micro-batch of no samples: one part, nothing launched.
    if (myriad::cuda::fused_logit_parts(0, 0, 1000) != 1 ||
        myriad::cuda::fused_logit_stats(nullptr, 0, nullptr, nullptr, 1000, 512, nullptr, 0, arc,
                                        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        nullptr) != cudaSuccess) {
      std::printf("empty batch: FAILED\n");
      ++failed;
    }
    // Keeping needs every sample's reference: none given is refused before anything launches.
    if (myriad::cuda::fused_logit_stats(nullptr, 1, nullptr, nullptr, 1000, 512, nullptr, 0, arc,
                                        nullptr, nullptr, nullptr, reinterpret_cast<float*>(16),
                                        reinterpret_cast<void*>(16), nullptr,
                                        nullptr) != cudaErrorInvalidValue ||
        myriad::cuda::kept_finish(nullptr, 1, 1000, nullptr, nullptr, 0, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, arc, nullptr, nullptr,
                                  nullptr) != cudaErrorInvalidValue) {
      std::printf("keeping without references: FAILED\n");
      ++failed;
    }
    return failed == 0 ? 0 : 1;
  }
  for (int64_t batch : {128, 512, 1024})
    for (int64_t classes : {int64_t{1} << 19, int64_t{4} << 20}) time_case(batch, classes, 512);
  time_case(2048, int64_t{4} << 20, 512);
  return 0;
}
