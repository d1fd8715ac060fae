// The fused SGD on classifier rows (hopper/fused_weight_update.h) against a float64 reference on
// the same bf16 inputs and against sgd_rows on the gradient formed on the host: row gradients,
// storage types, momentum, Nesterov, Partial FC's index, and shapes that leave partial tiles of
// rows, columns and samples; then its time beside cuBLAS's weight-gradient GEMM and sgd_rows.
//   fused_weight_update_check [check|time]

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../src/classifier/cuda/hopper/fused_weight_update.h"
#include "check_support.cuh"
#include "myriad/util/stochastic_round.h"

using myriad::RowGradient;
using myriad::cuda::ElementType;
using myriad::cuda::SgdArgs;
using myriad::cuda::WeightShard;

using myriad::testing::time_ms;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // float32's unit roundoff
constexpr uint64_t kSeed = 0x9d2c5680a1b3e7f1ull;
constexpr int64_t kFirstRow = 1000;
constexpr float kLr = 0.1f, kMomentum = 0.9f, kDecay = 5e-4f, kMultiplier = 0.5f;

// A float32 or bf16 array on the host, as the device holds it.
struct Array {
  bool bf16 = false;
  std::vector<float> f;
  std::vector<__nv_bfloat16> h;

  Array(bool is_bf16, size_t n) : bf16(is_bf16) { bf16 ? h.resize(n) : f.resize(n); }
  size_t size() const { return bf16 ? h.size() : f.size(); }
  size_t bytes() const { return size() * (bf16 ? 2 : 4); }
  void* data() { return bf16 ? static_cast<void*>(h.data()) : static_cast<void*>(f.data()); }
  const void* data() const { return const_cast<Array*>(this)->data(); }
  ElementType type() const { return bf16 ? ElementType::kBFloat16 : ElementType::kFloat32; }
  double at(size_t i) const { return bf16 ? double(__bfloat162float(h[i])) : double(f[i]); }
  uint16_t bits(size_t i) const { return __bfloat16_as_ushort(h[i]); }
  void set(size_t i, float v) { bf16 ? void(h[i] = __float2bfloat16(v)) : void(f[i] = v); }
  bool same(const Array& o, size_t from, size_t n) const {
    const size_t e = bf16 ? 2 : 4;
    return n == 0 || std::memcmp(static_cast<const char*>(data()) + from * e,
                                 static_cast<const char*>(o.data()) + from * e, n * e) == 0;
  }
};

void* upload(const void* host, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* d = nullptr;
  CHECK(cudaMalloc(&d, bytes));
  CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
template <class T>
T* upload(const std::vector<T>& v) {
  return static_cast<T*>(upload(v.data(), v.size() * sizeof(T)));
}

struct Case {
  RowGradient grad_of;
  int momentum;  // 0: none (null buffer, momentum 0), 1: float32 buffer, 2: bf16 buffer
  int nesterov, multiplier, indexed;  // multiplier: null or a device float of 0.5
  int dim;
  int64_t batch, count;
};

struct Problem {
  Case c;
  int64_t rows = 0, begin = 0;          // of the shard; the chunk's first position
  std::vector<int64_t> index, row_of;   // index: empty without one; row_of[r]: r's shard row
  std::vector<__nv_bfloat16> grad, xt;  // logit_grad [count, batch], x transposed [dim, batch]
  Array w{false, 0}, m{false, 0};       // the shard's initial weights and momentum
};

Problem make_problem(const Case& c, uint64_t seed) {
  Problem p;
  p.c = c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  p.row_of.resize(c.count);
  if (c.indexed) {
    // A sorted random subset of the shard's rows from position 11 of the index; its other
    // entries name rows outside the subset, which must stay as they are.
    p.rows = 2 * c.count + 64, p.begin = 11;
    std::vector<int64_t> perm(p.rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + c.count, p.row_of.begin());
    std::sort(p.row_of.begin(), p.row_of.end());
    p.index.resize(p.begin + c.count + 5);
    for (int64_t i = 0, j = c.count; i < int64_t(p.index.size()); ++i)
      p.index[i] = i >= p.begin && i < p.begin + c.count ? p.row_of[i - p.begin] : perm[j++];
  } else {
    p.rows = c.count + 66, p.begin = 37;
    std::iota(p.row_of.begin(), p.row_of.end(), p.begin);
  }
  const int dim = c.dim;
  p.w = Array(true, p.rows * dim);
  std::uniform_real_distribution<float> spread(0.3f, 3.0f);  // rows of different norms
  for (int64_t s = 0; s < p.rows; ++s) {
    const float sd = 0.05f * spread(rng);
    for (int k = 0; k < dim; ++k) p.w.set(s * dim + k, normal(rng) * sd);
  }
  p.m = Array(c.momentum == 2, c.momentum ? p.rows * dim : 0);
  for (size_t i = 0; i < p.m.size(); ++i) p.m.set(i, normal(rng) * 0.01f);
  p.grad.resize(c.count * c.batch);
  for (__nv_bfloat16& e : p.grad) e = __float2bfloat16(normal(rng) * 0.01f);
  p.xt.resize(dim * c.batch);
  std::vector<float> v(dim);
  for (int64_t b = 0; b < c.batch; ++b) {
    double norm = 0;
    for (float& e : v) e = normal(rng), norm += double(e) * e;
    for (int k = 0; k < dim; ++k)
      p.xt[k * c.batch + b] = __float2bfloat16(float(v[k] / std::sqrt(norm)));
  }
  return p;
}

// The updated rows in float64, [count, dim], with bounds on a float32 computation's error, and
// the gradient rounded to float32 for sgd_rows. The bounds are first-order worst cases:
// - g_k = sum_b of exact bf16 products (float32 holds them), summed in float32 in any order,
//   rounded or truncated (tensor cores may truncate): |error| <= 2 batch u sum_b |G x|;
// - w.g and |w|^2 likewise over dim terms, plus g's errors; rsqrtf within 2 ulp;
// - the few float32 operations of the update, 4u of their operands' magnitudes each step.
// Each case prints its worst error over its bound; a block of 64 samples left out, or a wrong
// column, row or momentum step, errs by thousands of times the bound.
struct Reference {
  std::vector<double> w, m, tol_w, tol_m;
  std::vector<float> grad;
};

Reference reference(const Problem& p) {
  const Case& c = p.c;
  const int dim = c.dim;
  const int64_t batch = c.batch, n = c.count * dim;
  Reference ref{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
                std::vector<double>(n), std::vector<float>(n)};
  std::vector<double> xt(p.xt.size());
  for (size_t i = 0; i < xt.size(); ++i) xt[i] = __bfloat162float(p.xt[i]);
  const double mult = c.multiplier ? kMultiplier : 1.0, mom = c.momentum ? kMomentum : 0.0;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<double> g(dim), eg(dim), gb(batch);
      for (int64_t r = t; r < c.count; r += threads) {
        for (int64_t b = 0; b < batch; ++b) gb[b] = __bfloat162float(p.grad[r * batch + b]);
        for (int k = 0; k < dim; ++k) {
          double sum = 0, magnitude = 0;
          for (int64_t b = 0; b < batch; ++b) {
            const double v = gb[b] * xt[k * batch + b];
            sum += v, magnitude += std::fabs(v);
          }
          g[k] = sum, eg[k] = 2 * batch * kU * magnitude;
          ref.grad[r * dim + k] = float(sum);
        }
        const int64_t s = p.row_of[r];
        double dot = 0, squares = 0, e_dot = 0;
        for (int k = 0; k < dim; ++k) {
          const double w = p.w.at(s * dim + k);
          dot += w * g[k], squares += w * w;
          e_dot += std::fabs(w) * eg[k] + 2 * dim * kU * std::fabs(w * g[k]);
        }
        dot *= mult, e_dot *= mult;
        double scale = 1, radial = 0, e_scale = 0, e_radial = 0;
        if (c.grad_of != RowGradient::kRow) {
          const double inv = 1 / std::sqrt(std::max(squares, 1e-24)), e_inv = (dim + 4) * kU;
          const int power = c.grad_of == RowGradient::kUnitRow ? 3 : 2;
          if (power == 3) scale = inv, e_scale = inv * e_inv;
          radial = dot * std::pow(inv, power);
          e_radial = e_dot * std::pow(inv, power) + std::fabs(radial) * (power * e_inv + 4 * kU);
        }
        for (int k = 0; k < dim; ++k) {
          const int64_t i = r * dim + k;
          const double w = p.w.at(s * dim + k), b0 = c.momentum ? p.m.at(s * dim + k) : 0.0;
          const double dw = g[k] * mult * scale - radial * w;
          const double e_dw = mult * (scale * eg[k] + e_scale * std::fabs(g[k])) +
                              e_radial * std::fabs(w) +
                              4 * kU * (std::fabs(g[k] * mult * scale) + std::fabs(radial * w));
          const double d = dw + double(kDecay) * w;
          const double magnitude = std::fabs(dw) + kDecay * std::fabs(w) + mom * std::fabs(b0);
          const double b = mom * b0 + d;
          const double step = c.nesterov ? d + mom * b : b;
          ref.m[i] = b;
          ref.tol_m[i] = e_dw + 4 * kU * magnitude;
          ref.w[i] = w - double(kLr) * step;
          ref.tol_w[i] = kLr * (1 + (c.nesterov ? mom : 0)) * (e_dw + 8 * kU * magnitude) +
                         4 * kU * (std::fabs(w) + kLr * std::fabs(step));
        }
      }
    });
  for (std::thread& th : pool) th.join();
  return ref;
}

// x transposed as fused_sgd_rows reads it: rows in its column order, padded with zeros.
std::vector<__nv_bfloat16> kernel_xt(const Problem& p) {
  const int rows = myriad::cuda::fused_sgd_rows_xt_rows(p.c.dim);
  std::vector<__nv_bfloat16> out(size_t(rows) * p.c.batch, __float2bfloat16(0.0f));
  for (int q = 0; q < rows; ++q) {
    const int k = myriad::cuda::fused_sgd_rows_column(q);
    if (k < p.c.dim)
      std::copy_n(p.xt.begin() + size_t(k) * p.c.batch, p.c.batch,
                  out.begin() + size_t(q) * p.c.batch);
  }
  return out;
}

struct State {
  Array w, m;
};

// The shard's initial state through `launch` (fused_sgd_rows or sgd_rows), read back.
template <class F>
State run(const Problem& p, F launch) {
  State out{p.w, p.m};
  void* w = upload(p.w.data(), p.w.bytes());
  void* m = upload(p.m.data(), p.m.bytes());  // null without a buffer
  CHECK(launch(WeightShard{w, p.w.type(), kFirstRow, kSeed}, m));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(out.w.data(), w, out.w.bytes(), cudaMemcpyDeviceToHost));
  if (m != nullptr) CHECK(cudaMemcpy(out.m.data(), m, out.m.bytes(), cudaMemcpyDeviceToHost));
  cudaFree(w), cudaFree(m);
  return out;
}

// A case's failures, the first of them in words, and its worst float32 error over its bound.
struct Verdict {
  int failures = 0;
  double worst = 0;
  char first[320] = "";
  void fail(const char* format, ...) {
    if (failures++ > 0) return;
    va_list args;
    va_start(args, format);
    std::vsnprintf(first, sizeof first, format, args);
    va_end(args);
  }
};

// Element e of `got` (chunk row r, column k) against the reference value `want` within `tol`.
// bf16 weights: one of the two bf16 values around [want - s, want + s], s = tol + 1e-5 |want|
// (a value at a boundary of bf16 goes either way), and, since stochastic rounding is monotone
// for fixed bits, the draw of element e's own rounding bits there: usually one exact value.
// bf16 momentum: round-to-nearest of a value in that interval.
void compare(bool weight, const Array& got, size_t e, int64_t r, int k, double want, double tol,
             uint32_t bits, Verdict& v) {
  const double x = got.at(e);
  const char* what = weight ? "weight" : "momentum";
  const auto draw = [](double value, uint32_t random) {
    return double(
        __bfloat162float(__ushort_as_bfloat16(myriad::bf16_bits_stochastic(float(value), random))));
  };
  const auto nearest = [](double value) {
    return double(__bfloat162float(__float2bfloat16(float(value))));
  };
  if (!got.bf16) {
    const double err = std::fabs(x - want);
    if (!(err <= tol))
      v.fail("%s row %lld col %d: got %.9g, want %.9g: |error| %.3g over its bound %.3g", what,
             (long long)r, k, x, want, err, tol);
    else
      v.worst = std::max(v.worst, err / tol);
    return;
  }
  const double s = tol + 1e-5 * std::fabs(want);
  if (!weight) {
    if (!(x >= nearest(want - s) && x <= nearest(want + s)))
      v.fail("momentum row %lld col %d: got %.9g, want %.9g (+-%.3g) rounded to nearest",
             (long long)r, k, x, want, s);
    return;
  }
  const double lo = std::min(draw(want - s, 0), draw(want - s, 0xFFFF));
  const double hi = std::max(draw(want + s, 0), draw(want + s, 0xFFFF));
  if (!(x >= lo && x <= hi))
    v.fail("weight row %lld col %d: got %.9g, not a bf16 neighbour of %.9g (+-%.3g)", (long long)r,
           k, x, want, s);
  else if (!(x >= draw(want - s, bits) && x <= draw(want + s, bits)))
    v.fail("weight row %lld col %d: got %.9g, want %.9g: not the draw of its rounding bits %08x",
           (long long)r, k, x, want, bits);
}

// sgd_rows' element against the fused kernel's: float32 within both bounds; bf16 counted where
// they differ (both draw the same bits: only a value within float32's error of a threshold of
// rounding may go the other way), and at most one ulp apart, or, near zero, where float32's
// error spans several, within both bounds and one rounding step.
void compare_paths(const Array& a, const Array& b, size_t e, double tol, int64_t& differ,
                   Verdict& v) {
  const double x = a.at(e), y = b.at(e);
  if (!a.bf16) {
    if (!(std::fabs(x - y) <= 2 * tol))
      v.fail("element %zu: fused %.9g, sgd_rows %.9g, apart by over %.3g", e, x, y, 2 * tol);
  } else if (a.bits(e) != b.bits(e)) {
    const auto ordered = [](uint16_t u) { return u & 0x8000 ? -(u & 0x7FFF) : int(u); };
    const double step =
        std::ldexp(1.0, std::ilogb(std::max({std::fabs(x), std::fabs(y), 1e-30})) - 7);
    ++differ;
    if (std::abs(ordered(a.bits(e)) - ordered(b.bits(e))) > 1 && std::fabs(x - y) > 2 * tol + step)
      v.fail("element %zu: fused %.9g, sgd_rows %.9g, over one bf16 ulp apart", e, x, y);
  }
}

const char* const kGradOf[] = {"row", "unit row", "unit/|w|"};  // RowGradient's order
const char* const kStorage[] = {"none", "f32", "bf16"};

int check_case(int number, const Case& c) {
  const Problem p = make_problem(c, 1234 + number);
  const Reference ref = reference(p);
  const int dim = c.dim;
  void* grad = upload(p.grad);
  void* xt = upload(kernel_xt(p));
  int64_t* index = upload(p.index);  // null without one
  float* mult = c.multiplier ? upload(std::vector<float>{kMultiplier}) : nullptr;
  float* grad32 = upload(ref.grad);
  // The rows' gradient as a bf16 GEMM output stores it, and those values widened to float32.
  std::vector<__nv_bfloat16> narrow(ref.grad.size());
  std::vector<float> widened(ref.grad.size());
  for (size_t i = 0; i < ref.grad.size(); ++i) {
    narrow[i] = __float2bfloat16(ref.grad[i]);
    widened[i] = __bfloat162float(narrow[i]);
  }
  __nv_bfloat16* grad16 = upload(narrow);
  float* grad16_as32 = upload(widened);
  const SgdArgs args{kLr, c.momentum ? kMomentum : 0.0f, kDecay, c.nesterov != 0, mult};
  const auto fused = [&](WeightShard w, void* m) {
    return myriad::cuda::fused_sgd_rows(w, m, p.m.type(), grad, xt, c.batch, dim, index, p.begin,
                                        c.count, c.grad_of, args, nullptr);
  };
  const auto plain_of = [&](const void* g, ElementType type) {
    return [&, g, type](WeightShard w, void* m) {
      return myriad::cuda::sgd_rows(w, m, p.m.type(), g, type, dim, index, p.begin, c.count,
                                    c.grad_of, args, nullptr, {}, nullptr);
    };
  };
  const State got = run(p, fused), again = run(p, fused);
  const State other = run(p, plain_of(grad32, ElementType::kFloat32));
  const State from16 = run(p, plain_of(grad16, ElementType::kBFloat16));
  const State from16_as32 = run(p, plain_of(grad16_as32, ElementType::kFloat32));
  cudaFree(grad), cudaFree(xt), cudaFree(index), cudaFree(mult), cudaFree(grad32);
  cudaFree(grad16), cudaFree(grad16_as32);

  Verdict v;
  int64_t differ = 0;
  std::vector<char> updated(p.rows, 0);
  for (int64_t r = 0; r < c.count; ++r) {
    const int64_t s = p.row_of[r];
    updated[s] = 1;
    for (int k = 0; k < dim; ++k) {
      const int64_t i = r * dim + k, e = s * dim + k;
      const uint32_t bits = myriad::rounding_bits(kSeed, (kFirstRow + s) * dim + k);
      compare(true, got.w, e, r, k, ref.w[i], ref.tol_w[i], bits, v);
      compare_paths(got.w, other.w, e, ref.tol_w[i], differ, v);
      if (c.momentum == 0) continue;
      compare(false, got.m, e, r, k, ref.m[i], ref.tol_m[i], 0, v);
      compare_paths(got.m, other.m, e, ref.tol_m[i], differ, v);
    }
  }
  for (int64_t s = 0; s < p.rows; ++s)
    if (!updated[s] &&
        (!got.w.same(p.w, s * dim, dim) || !got.m.same(p.m, s * dim, p.m.size() ? dim : 0)))
      v.fail("shard row %lld, not in the chunk, changed", (long long)s);
  if (!got.w.same(again.w, 0, p.w.size()) || !got.m.same(again.m, 0, p.m.size()))
    v.fail("a rerun on the same state differs");
  // sgd_rows reads a bf16 gradient as its values: the same bits as from their float32 copies.
  if (!from16.w.same(from16_as32.w, 0, p.w.size()) || !from16.m.same(from16_as32.m, 0, p.m.size()))
    v.fail("sgd_rows on a bf16 gradient differs from sgd_rows on its values in float32");
  // One spare, so that a lone crossing in a case of a few hundred elements passes.
  const int64_t bf16_elements = c.count * dim * (1 + int(c.momentum == 2));
  if (differ > bf16_elements / 1000 + 1)
    v.fail("%lld of %lld bf16 elements differ from sgd_rows'", (long long)differ,
           (long long)bf16_elements);
  std::printf(
      "case %2d: %-8s momentum %s%s, multiplier %s, %s, dim %d batch %lld count %lld: "
      "float32 error %.3f of bound, %lld/%lld bf16 differ from sgd_rows: %s\n",
      number, kGradOf[int(c.grad_of)], kStorage[c.momentum], c.nesterov ? " nesterov" : "",
      c.multiplier ? "0.5" : "null", c.indexed ? "index" : "no index", dim, (long long)c.batch,
      (long long)c.count, v.worst, (long long)differ, (long long)bf16_elements,
      v.failures ? "FAILED" : "ok");
  if (v.failures) std::printf("  %d failures; first: %s\n", v.failures, v.first);
  return v.failures ? 1 : 0;
}

// What the fused kernel doesn't take: rows of samples not whole 16-byte units, too wide or not
// of whole 16-byte units, float32 weights; the launcher refuses them without touching its
// pointers. Counts its checks into `number`.
int check_rejects(int& number) {
  int failed = 0;
  const SgdArgs args{kLr, 0.0f, kDecay, false, nullptr};
  struct Shape {
    int64_t batch;
    int dim;
    ElementType weights;
  };
  const Shape shapes[] = {{12, 512, ElementType::kBFloat16},
                          {256, 520, ElementType::kBFloat16},
                          {256, 100, ElementType::kBFloat16},
                          {256, 512, ElementType::kFloat32}};
  for (const Shape& shape : shapes) {
    const cudaError_t rc = myriad::cuda::fused_sgd_rows(
        WeightShard{nullptr, shape.weights, 0, kSeed}, nullptr, ElementType::kFloat32, nullptr,
        nullptr, shape.batch, shape.dim, nullptr, 0, 1, RowGradient::kRow, args, nullptr);
    const bool ok = !myriad::cuda::fused_sgd_rows_take(shape.batch, shape.dim, shape.weights) &&
                    rc != cudaSuccess;
    std::printf("reject batch %lld dim %d %s weights: %s\n", (long long)shape.batch, shape.dim,
                shape.weights == ElementType::kFloat32 ? "float32" : "bf16", ok ? "ok" : "FAILED");
    failed += ok ? 0 : 1;
    ++number;
  }
  // Weights or momentum that do not start on a pack of 8 elements (a view into a shard).
  alignas(32) static float storage[16];
  const std::pair<ElementType, void*> misaligned[] = {{ElementType::kBFloat16, storage + 1},
                                                      {ElementType::kFloat32, storage + 1}};
  for (const auto& [type, pointer] : misaligned) {
    const bool weights = type == ElementType::kBFloat16;
    const cudaError_t rc = myriad::cuda::fused_sgd_rows(
        WeightShard{weights ? pointer : storage, ElementType::kBFloat16, 0, kSeed},
        weights ? storage : pointer, ElementType::kFloat32, storage, storage, 256, 512, nullptr, 0,
        1, RowGradient::kRow, args, nullptr);
    const bool ok = rc == cudaErrorMisalignedAddress;
    std::printf("reject misaligned %s: %s\n", weights ? "bf16 weights" : "float32 momentum",
                ok ? "ok" : "FAILED");
    failed += ok ? 0 : 1;
    ++number;
  }
  cudaGetLastError();
  return failed;
}

// Uniform bf16 values in (-amplitude, amplitude), filled on the device.
__global__ void fill_random(__nv_bfloat16* p, int64_t n, float amplitude, uint64_t salt) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = myriad::splitmix64(salt ^ (uint64_t(i) << 8));
    p[i] = __float2bfloat16(amplitude * (float(h >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

// bf16 weights and momentum, kUnitRowOverNorm, Nesterov. At 4M rows, batch 1024: 8 GiB of
// logit_grad, 8 GiB of float32 gradient for cuBLAS's path, 4 GiB each of weights and momentum.
void time_case(int64_t rows, int64_t batch, int dim) {
  const auto allocate = [](int64_t bytes) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    return p;
  };
  auto* w = static_cast<__nv_bfloat16*>(allocate(rows * dim * 2));
  auto* m = static_cast<__nv_bfloat16*>(allocate(rows * dim * 2));
  auto* g = static_cast<__nv_bfloat16*>(allocate(rows * batch * 2));
  auto* xt = static_cast<__nv_bfloat16*>(allocate(dim * batch * 2));
  auto* grad = static_cast<float*>(allocate(rows * dim * 4));
  auto* grad16 = static_cast<__nv_bfloat16*>(allocate(rows * dim * 2));
  fill_random<<<2048, 256>>>(w, rows * dim, 0.08f, 1);
  fill_random<<<2048, 256>>>(m, rows * dim, 0.02f, 2);
  fill_random<<<2048, 256>>>(g, rows * batch, 0.02f, 3);
  fill_random<<<256, 256>>>(xt, dim * batch, 1.7f / std::sqrt(float(dim)), 4);
  CHECK(cudaGetLastError());
  const SgdArgs args{kLr, kMomentum, kDecay, true, nullptr};
  const WeightShard shard{w, ElementType::kBFloat16, 0, kSeed};
  const auto grad_of = RowGradient::kUnitRowOverNorm;
  const auto fused = [&] {
    CHECK(myriad::cuda::fused_sgd_rows(shard, m, ElementType::kBFloat16, g, xt, batch, dim, nullptr,
                                       0, rows, grad_of, args, nullptr));
  };
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const float one = 1, zero = 0;
  // Column-major: grad^T [dim, rows] = xt (as [batch, dim])^T logit_grad^T ([batch, rows]), in
  // float32 or (row_gradient_store, bf16 rows) bf16.
  const auto gemm_to = [&](void* out, cudaDataType_t type) {
    if (cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, dim, int(rows), int(batch), &one, xt,
                     CUDA_R_16BF, int(batch), g, CUDA_R_16BF, int(batch), &zero, out, type, dim,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
  };
  const auto update_from = [&](const void* from, ElementType type) {
    CHECK(myriad::cuda::sgd_rows(shard, m, ElementType::kBFloat16, from, type, dim, nullptr, 0,
                                 rows, grad_of, args, nullptr, {}, nullptr));
  };
  const auto gemm = [&] { gemm_to(grad, CUDA_R_32F); };
  const auto update = [&] { update_from(grad, ElementType::kFloat32); };
  const float fused_ms = time_ms(fused, 10), gemm_ms = time_ms(gemm, 10),
              update_ms = time_ms(update, 10);
  const float unfused = time_ms([&] { gemm(), update(); }, 10);
  const float gemm16_ms = time_ms([&] { gemm_to(grad16, CUDA_R_16BF); }, 10),
              update16_ms = time_ms([&] { update_from(grad16, ElementType::kBFloat16); }, 10);
  const float unfused16 = time_ms(
      [&] { gemm_to(grad16, CUDA_R_16BF), update_from(grad16, ElementType::kBFloat16); }, 10);
  // Effective: the bytes the update can't avoid (logit_grad read; weights and momentum read and
  // written) over each path's time.
  const double bytes = double(rows) * (2.0 * batch + 8.0 * dim), flop = 2.0 * rows * batch * dim;
  std::printf(
      "time rows %lld dim %d batch %lld: fused %.3f ms (%.0f GB/s, %.0f TFLOP/s); cuBLAS GEMM + "
      "sgd_rows %.3f ms (%.3f + %.3f; %.0f GB/s, %.0f TFLOP/s): %.2fx; with a bf16 rows' "
      "gradient %.3f ms (%.3f + %.3f)\n",
      (long long)rows, dim, (long long)batch, fused_ms, bytes / fused_ms / 1e6,
      flop / fused_ms / 1e9, unfused, gemm_ms, update_ms, bytes / unfused / 1e6,
      flop / unfused / 1e9, unfused / fused_ms, unfused16, gemm16_ms, update16_ms);
  cublasDestroy(handle);
  cudaFree(w), cudaFree(m), cudaFree(g), cudaFree(xt), cudaFree(grad), cudaFree(grad16);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = myriad::testing::mode_on_hopper(argc, argv);
  if (mode == "time") {
    time_case(int64_t{4} << 20, 256, 512);
    time_case(int64_t{4} << 20, 1024, 512);
    time_case(int64_t{512} << 10, 256, 512);
    // Where the fused update stops being the faster one (ShardedSoftmaxOptions::fused_update).
    for (const int64_t batch : {128, 384, 512, 768}) time_case(int64_t{4} << 20, batch, 512);
    return 0;
  }
  if (mode != "check") {
    std::fprintf(stderr, "usage: %s [check|time]\n", argv[0]);
    return 2;
  }
  constexpr RowGradient kRow = RowGradient::kRow, kUnit = RowGradient::kUnitRow,
                        kOver = RowGradient::kUnitRowOverNorm;
  // grad_of, momentum (0 none, 1 f32, 2 bf16), Nesterov, multiplier 0.5, index, dim, batch,
  // count; bf16 weights. D = 136 and 264 leave partial 128-column blocks; D > 256 takes 2-CTA
  // clusters.
  // clang-format off
  const Case cases[] = {
    {kRow, 0, 0, 0, 0, 64, 8, 1}, {kRow, 1, 1, 1, 0, 136, 72, 127},
    {kRow, 2, 0, 0, 1, 264, 256, 129}, {kRow, 1, 1, 1, 1, 512, 1000, 300},
    {kRow, 2, 0, 0, 0, 384, 256, 300}, {kRow, 0, 0, 1, 1, 256, 8, 127},
    {kRow, 1, 0, 1, 1, 384, 72, 129}, {kRow, 2, 1, 0, 0, 64, 1000, 300},
    {kUnit, 1, 0, 0, 0, 64, 72, 300}, {kUnit, 0, 0, 1, 1, 136, 256, 129},
    {kUnit, 2, 1, 1, 0, 256, 1000, 127}, {kUnit, 1, 0, 0, 1, 264, 8, 300},
    {kUnit, 2, 1, 0, 1, 384, 72, 1}, {kUnit, 0, 0, 1, 0, 512, 256, 129},
    {kUnit, 1, 1, 1, 1, 512, 1000, 127}, {kUnit, 2, 0, 1, 0, 136, 1000, 1},
    {kUnit, 1, 1, 0, 0, 512, 8, 300}, {kUnit, 2, 1, 0, 1, 264, 72, 129},
    {kOver, 1, 0, 1, 0, 64, 1000, 129}, {kOver, 2, 1, 0, 1, 136, 8, 300},
    {kOver, 2, 0, 1, 1, 256, 256, 1}, {kOver, 1, 1, 0, 0, 264, 72, 127},
    {kOver, 0, 0, 0, 0, 384, 1000, 300}, {kOver, 2, 0, 1, 1, 512, 72, 300},
    {kOver, 2, 1, 1, 0, 384, 8, 129}, {kOver, 1, 1, 0, 1, 264, 1000, 129},
    {kOver, 2, 1, 1, 0, 64, 256, 127}, {kOver, 1, 0, 0, 0, 512, 256, 127},
    // Many tiles: 157 of 128 rows, two CTAs each at D = 512; then over a thousand, so that
    // every persistent CTA walks several and the ring and the barriers' phases wrap many times.
    {kOver, 2, 1, 1, 1, 512, 256, 20000}, {kUnit, 1, 0, 0, 0, 512, 256, 20000},
    {kOver, 2, 0, 1, 1, 512, 72, 150000}, {kRow, 1, 1, 0, 0, 256, 72, 150000},
  };
  // clang-format on
  int failed = 0, number = 0;
  for (const Case& c : cases) failed += check_case(++number, c);
  failed += check_rejects(number);
  std::printf("%s: %d of %d checks failed\n", failed ? "FAILED" : "passed", failed, number);
  return failed ? 1 : 0;
}
