#include "cpu_softmax.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "myriad/util/cpu_clones.h"
#include "myriad/util/error.h"
#include "myriad/util/vector_math.h"

namespace myriad {

namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Rows a task takes at a time: about 256 KiB of logits, which stay in the core's L2 cache between
// the two passes of the statistics (the largest logit, then the sum).
int64_t tile_rows(int64_t batch) {
  return std::max<int64_t>(16, (int64_t{64} << 10) / std::max<int64_t>(batch, 1));
}

// What the loops read; `dot` is null for the kept exponentials' gradient, which reads no logits.
// A non-target logit is mult * clamp(cosine, lo, hi): s and [-1, 1] for a
// normalising margin, else 1 and no bounds, so one loop serves both. A sample's target, where it
// lies in the chunk, is at row target_row[b] (else -1), with margin logit target_z[b] and
// dz/dcos target_dz[b].
struct Kernel {
  const float* dot;
  const float* row_scale;  // or null
  int64_t rows, batch, tile_rows;
  const int32_t* target_row;
  const float* target_z;
  const float* target_dz;
  float lo, hi, mult;

  float scale(int64_t j) const { return row_scale != nullptr ? row_scale[j] : 1.0f; }
};

// A chunk's row in the loops: its logits, the samples' targets and what makes logits of the row's
// dot products, read into locals so that the compiler sees that the stores alias none of them.
struct RowLoop {
  const float* __restrict__ dot;
  float scale;  // the row's cosine scale
  int32_t row;
  const int32_t* __restrict__ target_row;
  const float* __restrict__ target_z;
  float lo, hi, mult;

  RowLoop(const Kernel& k, int64_t j)
      : dot(k.dot != nullptr ? k.dot + j * k.batch : nullptr),
        scale(k.scale(j)),
        row(static_cast<int32_t>(j)),
        target_row(k.target_row),
        target_z(k.target_z),
        lo(k.lo),
        hi(k.hi),
        mult(k.mult) {}

  // Sample b's logit: std::min and std::max pass a NaN cosine on, as LibTorch's clamp does. Both
  // sides are computed, so that the choice is a select, not a branch the loop cannot vectorise.
  MYRIAD_INLINE_LOOP float logit(int64_t b, bool target) const {
    const float other = mult * std::min(std::max(dot[b] * scale, lo), hi);
    const float z = target_z[b];
    return target ? z : other;
  }
  MYRIAD_INLINE_LOOP bool target(int64_t b) const { return target_row[b] == row; }
};

// Rows [first, last) into m (their largest logit per sample) and s (the sum of exp(z - m)); with
// kKeep, each exp(z - m) is also stored in `kept`.
template <bool kKeep>
MYRIAD_INLINE_LOOP void stats_tile(const Kernel& k, int64_t first, int64_t last,
                                   float* __restrict__ m, float* __restrict__ s, float* kept) {
  const int64_t batch = k.batch;
  std::fill(m, m + batch, -kInfinity);
  std::fill(s, s + batch, 0.0f);
  for (int64_t j = first; j < last; ++j) {
    const RowLoop r(k, j);
    for (int64_t b = 0; b < batch; ++b) m[b] = std::max(m[b], r.logit(b, r.target(b)));
  }
  for (int64_t j = first; j < last; ++j) {
    const RowLoop r(k, j);
    float* __restrict__ e = kKeep ? kept + j * batch : nullptr;
    for (int64_t b = 0; b < batch; ++b) {
      const float v = vector_exp(r.logit(b, r.target(b)) - m[b]);
      s[b] += v;
      if constexpr (kKeep) e[b] = v;
    }
  }
}

MYRIAD_CPU_CLONES void stats_tiles(const Kernel& k, int64_t first_tile, int64_t last_tile,
                                   float* tile_max, float* tile_sum, float* kept) {
  for (int64_t t = first_tile; t < last_tile; ++t) {
    const int64_t first = t * k.tile_rows, last = std::min(k.rows, first + k.tile_rows);
    float* m = tile_max + t * k.batch;
    float* s = tile_sum + t * k.batch;
    if (kept != nullptr) {
      stats_tile<true>(k, first, last, m, s, kept);
    } else {
      stats_tile<false>(k, first, last, m, s, kept);
    }
  }
}

// Rows [first, last) of the gradient into `out`: coef (p - one-hot) dz/dcos, times the row's
// scale, where p = softmax(row, b, target, the row's out) is the softmax.
template <typename Out, class Softmax>
MYRIAD_INLINE_LOOP void gradient_rows(const Kernel& k, int64_t first, int64_t last, float coef,
                                      Out* __restrict__ out, const Softmax& softmax) {
  const int64_t batch = k.batch;
  const float* __restrict__ target_dz = k.target_dz;
  for (int64_t j = first; j < last; ++j) {
    const RowLoop r(k, j);
    Out* __restrict__ o = out + j * batch;
    const float row_coef = coef * r.scale;
    for (int64_t b = 0; b < batch; ++b) {
      const bool target = r.target(b);
      const float dz_dcos = target ? target_dz[b] : r.mult;
      const float p = softmax(r, b, target, o) - (target ? 1.0f : 0.0f);
      store_rounded(o + b, row_coef * (p * dz_dcos));
    }
  }
}

// From the logits: p = exp(z - row_max) / sum.
template <typename Out>
MYRIAD_INLINE_LOOP void grad_tile(const Kernel& k, int64_t first, int64_t last,
                                  const float* __restrict__ row_max,
                                  const float* __restrict__ row_inv_sum, float coef, Out* out) {
  gradient_rows(k, first, last, coef, out,
                [&](const RowLoop& r, int64_t b, bool target, const Out*) {
                  return vector_exp(r.logit(b, target) - row_max[b]) * row_inv_sum[b];
                });
}

template <typename Out>
MYRIAD_CPU_CLONES void grad_tiles(const Kernel& k, int64_t first_tile, int64_t last_tile,
                                  const float* row_max, const float* row_inv_sum, float coef,
                                  Out* out) {
  for (int64_t t = first_tile; t < last_tile; ++t) {
    const int64_t first = t * k.tile_rows;
    grad_tile(k, first, std::min(k.rows, first + k.tile_rows), row_max, row_inv_sum, coef, out);
  }
}

// From the kept exponentials e, written over them: p = e factor, where `factor` [B] is the tile's
// exp(max - row_max) / sum.
MYRIAD_INLINE_LOOP void kept_grad_tile(const Kernel& k, int64_t first, int64_t last,
                                       const float* __restrict__ factor, float coef, float* e) {
  gradient_rows(k, first, last, coef, e,
                [&](const RowLoop&, int64_t b, bool, const float* o) { return o[b] * factor[b]; });
}

MYRIAD_CPU_CLONES void kept_grad_tiles(const Kernel& k, int64_t first_tile, int64_t last_tile,
                                       const float* tile_max, const float* row_max,
                                       const float* row_inv_sum, float coef, float* e) {
  std::vector<float> factor(static_cast<size_t>(k.batch));
  for (int64_t t = first_tile; t < last_tile; ++t) {
    for (int64_t b = 0; b < k.batch; ++b)
      factor[b] = vector_exp(tile_max[t * k.batch + b] - row_max[b]) * row_inv_sum[b];
    const int64_t first = t * k.tile_rows;
    kept_grad_tile(k, first, std::min(k.rows, first + k.tile_rows), factor.data(), coef, e);
  }
}

CpuTargets chunk_targets(const CpuChunkLogits& c) {
  const int64_t rows = c.dot.size(0), batch = c.dot.size(1);
  CpuTargets t{std::vector<int32_t>(batch, -1), std::vector<float>(batch),
               std::vector<float>(batch)};
  const int64_t* target = c.target_col.data_ptr<int64_t>();
  const float* dot = c.dot.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t j = target[b] - c.begin;
    if (j < 0 || j >= rows) continue;
    t.row[b] = static_cast<int32_t>(j);
    const float scale = c.row_scale.defined() ? c.row_scale.data_ptr<float>()[j] : 1.0f;
    margin_target(dot[j * batch + b] * scale, c.params, &t.z[b], &t.dz_dcos[b]);
  }
  return t;
}

void check_chunk(const CpuChunkLogits& c) {
  const torch::Tensor& dot = c.dot;
  MYRIAD_CHECK(dot.device().is_cpu() && dot.scalar_type() == torch::kFloat32 && dot.dim() == 2 &&
                   dot.is_contiguous() && dot.size(0) < std::numeric_limits<int32_t>::max() &&
                   c.target_col.scalar_type() == torch::kInt64 && c.target_col.is_contiguous() &&
                   c.target_col.numel() == dot.size(1) &&
                   (!c.row_scale.defined() ||
                    (c.row_scale.scalar_type() == torch::kFloat32 && c.row_scale.is_contiguous() &&
                     c.row_scale.numel() == dot.size(0))),
               "the CPU softmax takes contiguous float32 logits [rows < 2^31, B] on the CPU with "
               "int64 targets [B] and float32 row scales [rows], got {} {}, {} {} and {}",
               dot.scalar_type(), dot.sizes(), c.target_col.scalar_type(), c.target_col.sizes(),
               c.row_scale.defined() ? c.row_scale.sizes() : torch::IntArrayRef());
}

// The loops' view of a chunk of `rows` x `batch` logits at `dot` (null for kept exponentials).
Kernel kernel_of(const float* dot, const torch::Tensor& row_scale, int64_t rows, int64_t batch,
                 const CpuTargets& t, const MarginParams& params) {
  const bool normalized = params.normalized;
  return Kernel{dot,
                row_scale.defined() ? row_scale.data_ptr<float>() : nullptr,
                rows,
                batch,
                tile_rows(batch),
                t.row.data(),
                t.z.data(),
                t.dz_dcos.data(),
                normalized ? -1.0f : -kInfinity,
                normalized ? 1.0f : kInfinity,
                normalized ? params.scale : 1.0f};
}

Kernel kernel_of(const CpuChunkLogits& c, const CpuTargets& t) {
  check_chunk(c);
  return kernel_of(c.dot.data_ptr<float>(), c.row_scale, c.dot.size(0), c.dot.size(1), t, c.params);
}

void check_statistics(const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                      int64_t batch) {
  MYRIAD_CHECK(row_max.scalar_type() == torch::kFloat32 && row_max.is_contiguous() &&
                   row_max.numel() == batch && row_inv_sum.scalar_type() == torch::kFloat32 &&
                   row_inv_sum.is_contiguous() && row_inv_sum.numel() == batch,
               "the CPU softmax's gradient takes float32 statistics [{}], got {} {} and {} {}",
               batch, row_max.scalar_type(), row_max.sizes(), row_inv_sum.scalar_type(),
               row_inv_sum.sizes());
}

int64_t tiles_of(const Kernel& k) {
  return (k.rows + k.tile_rows - 1) / k.tile_rows;
}

}  // namespace

void cpu_chunk_stats(const CpuChunkLogits& chunk, torch::Tensor& tile_max, torch::Tensor& tile_sum,
                     torch::Tensor& target_logit, CpuKeptExponentials* kept) {
  CpuTargets targets = chunk_targets(chunk);
  const Kernel k = kernel_of(chunk, targets);
  const int64_t tiles = tiles_of(k);
  tile_max = torch::empty({tiles, k.batch}, chunk.dot.options());
  tile_sum = torch::empty({tiles, k.batch}, chunk.dot.options());
  float* m = tile_max.data_ptr<float>();
  float* s = tile_sum.data_ptr<float>();
  float* e = nullptr;
  if (kept != nullptr) {
    MYRIAD_CHECK(kept->exps.scalar_type() == torch::kFloat32 && kept->exps.is_contiguous() &&
                     kept->exps.sizes() == chunk.dot.sizes(),
                 "the kept exponentials must be contiguous float32 {}, got {} {}",
                 chunk.dot.sizes(), kept->exps.scalar_type(), kept->exps.sizes());
    e = kept->exps.data_ptr<float>();
  }
  at::parallel_for(0, tiles, 1,
                   [&](int64_t first, int64_t last) { stats_tiles(k, first, last, m, s, e); });
  float* out = target_logit.data_ptr<float>();
  for (int64_t b = 0; b < k.batch; ++b)
    if (targets.row[b] >= 0) out[b] = targets.z[b];
  if (kept != nullptr) {
    kept->tile_max = tile_max;
    kept->row_scale = chunk.row_scale;
    kept->targets = std::move(targets);
  }
}

torch::Tensor cpu_chunk_grad(const CpuChunkLogits& chunk, const torch::Tensor& row_max,
                             const torch::Tensor& row_inv_sum, float coef,
                             torch::ScalarType dtype) {
  const CpuTargets targets = chunk_targets(chunk);
  const Kernel k = kernel_of(chunk, targets);
  check_statistics(row_max, row_inv_sum, k.batch);
  // float16 GEMMs take the float32 gradient converted.
  const bool bf16 = dtype == torch::kBFloat16;
  torch::Tensor out =
      torch::empty(chunk.dot.sizes(), chunk.dot.options().dtype(bf16 ? dtype : torch::kFloat32));
  const float* m = row_max.data_ptr<float>();
  const float* inv = row_inv_sum.data_ptr<float>();
  at::parallel_for(0, tiles_of(k), 1, [&](int64_t first, int64_t last) {
    if (bf16) {
      grad_tiles(k, first, last, m, inv, coef, out.data_ptr<c10::BFloat16>());
    } else {
      grad_tiles(k, first, last, m, inv, coef, out.data_ptr<float>());
    }
  });
  return out.to(dtype);
}

torch::Tensor cpu_kept_grad(CpuKeptExponentials& kept, const MarginParams& params,
                            const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                            float coef, torch::ScalarType dtype) {
  MYRIAD_CHECK(kept.exps.scalar_type() == torch::kFloat32 && kept.exps.is_contiguous() &&
                   kept.exps.dim() == 2,
               "the kept exponentials must be contiguous float32 [rows, B], got {} {}",
               kept.exps.scalar_type(), kept.exps.sizes());
  const int64_t rows = kept.exps.size(0), batch = kept.exps.size(1);
  float* e = kept.exps.data_ptr<float>();
  const Kernel k = kernel_of(nullptr, kept.row_scale, rows, batch, kept.targets, params);
  check_statistics(row_max, row_inv_sum, batch);
  MYRIAD_CHECK(kept.tile_max.numel() == tiles_of(k) * batch &&
                   static_cast<int64_t>(kept.targets.row.size()) == batch,
               "the kept exponentials' tile maxima are {}, not [{}, {}]", kept.tile_max.sizes(),
               tiles_of(k), batch);
  const float* m = row_max.data_ptr<float>();
  const float* inv = row_inv_sum.data_ptr<float>();
  at::parallel_for(0, tiles_of(k), 1, [&](int64_t first, int64_t last) {
    kept_grad_tiles(k, first, last, kept.tile_max.data_ptr<float>(), m, inv, coef, e);
  });
  const torch::Tensor grad = std::move(kept.exps);
  return grad.to(dtype);
}

}  // namespace myriad
