// The fused kernels of the sharded margin softmax on Hopper: logits x̂·Ŵᵀ computed tile by tile
// with wgmma and used in registers, never written. Forward scales and margins them and reduces
// them to per-row softmax statistics; only the statistics and the target logits reach memory,
// in parts, [parts, batch], which the combine and the cross-rank reduction take as they take
// chunk_stats' tiles. Backward recomputes them and writes the logits' gradient from the global
// statistics, in bf16 for the dX and dW GEMMs. Or forward keeps each logit's exponential against
// a reference r_b that bounds its sample's logits, exp(z - r_b) / |w_j| in bf16, and backward
// needs no products of its own: the logits' gradient off the targets is that times a factor of
// the row alone (kept_finish). A normalising margin's r_b is s; plain softmax's comes from its
// caller (Cauchy-Schwarz: |x_b| max_j |w_j|).
//
// The grid is persistent: CTA (row block r, lane l) keeps r's 128 rows of x̂ in shared memory and
// walks lane l's contiguous range of class tiles, the weights arriving through a TMA ring. The
// CTAs of one lane walk the same range in step, so a weight tile comes from device memory once
// and from L2 for the other row blocks. Within a CTA, two consumer warpgroups take alternate
// tiles and take turns on the tensor cores (FlashAttention 3's ping-pong), so that one reduces
// its tile while the other's products run.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fused_softmax.h"
#include "hopper.cuh"

namespace myriad::cuda {

namespace {

using namespace hopper;

constexpr int kRows = 128;  // samples per CTA
constexpr int kTile = kFusedTileRows;
constexpr int kWarpgroup = 128;
constexpr int kConsumers = 2 * kWarpgroup;
constexpr int kThreads = kConsumers + kWarpgroup;  // and one producer warpgroup
constexpr int kSharedLimit = 227 * 1024;
constexpr float kLog2e = 1.4426950408889634f;
// Named barriers: a warpgroup may issue its next tile's products once the other has issued its
// own (ids 1, 2), and the warpgroups meet to merge their statistics (id 3).
constexpr int kTurnBarrier = 1;
constexpr int kMergeBarrier = 3;
// ... and each warpgroup's threads meet around its staged gradients (ids 4, 5).
constexpr int kStagingBarrier = 4;

// The gradient kernel stages each warpgroup's gradients in shared memory, a box of 64 classes x
// 64 samples at a time in the 128-byte swizzle, for bulk tensor stores: whole lines to L2. Stores
// from registers (2 or 4 bytes each) took the kernel from 6.1 ms without stores to 10.5 (N = 1024,
// 4M classes, one H200); this takes it to 7.8, of which a stage of the ring, given up for the
// boxes, costs about 1 (measurements/2026-11-27-h200-gradient-stores).
struct NoStaging {};
struct Staging {
  __nv_bfloat16 box[2][64 * 64];  // per warpgroup, 64 classes x 64 samples
};

// What a kernel computes: the statistics, the statistics and the kept exponentials, or the
// logits' gradient. The last two write a bf16 [classes, batch] matrix.
enum class Pass { kStatistics, kKeep, kGradient };
constexpr bool writes_matrix(Pass pass) {
  return pass != Pass::kStatistics;
}

template <int kKBlocks, Pass kPass>
struct Shared {
  using Out = std::conditional_t<writes_matrix(kPass), Staging, NoStaging>;
  static constexpr int kXBytes = kKBlocks * kRows * kSwizzleElements * 2;
  static constexpr int kStageBytes = kTile * kSwizzleElements * 2;
  static constexpr int kRoom = kSharedLimit - kSwizzleAtomBytes - 512 - kXBytes - 2 * kTile * 4 -
                               kRows * 8 - static_cast<int>(sizeof(Out));
  static constexpr int kStages = kRoom / kStageBytes < 8 ? kRoom / kStageBytes : 8;
  static_assert(kStages >= 2, "x̂ leaves no room for a weight ring");

  __nv_bfloat16 x[kKBlocks][kRows * kSwizzleElements];
  __nv_bfloat16 w[kStages][kTile * kSwizzleElements];
  Out out;                            // 1024-aligned: x and w are whole swizzle atoms
  alignas(16) float scale[2][kTile];  // 1/|w_j| of the tile each warpgroup works on
  float2 merge[kRows];                // the second warpgroup's (max, sum) per row, for the first
  uint64_t x_full;
  uint64_t full[kStages];
  uint64_t empty[kStages];
  uint64_t scale_full[2];
  uint64_t scale_empty[2];
};

// Lane `lane` of `lanes` takes tiles [first, last): contiguous, sizes within one of each other.
struct TileRange {
  int64_t first, last;
};
__host__ __device__ inline TileRange lane_tiles(int64_t tiles, int lane, int lanes) {
  return {tiles * lane / lanes, tiles * (lane + 1) / lanes};
}

// The producer warp: x̂'s rows once, then every weight tile of the range through the stage
// ring, and each tile's 1/|w_j| for the warpgroup that takes it (tile n: warpgroup n % 2). Lane 0
// issues the copies.
template <class S>
__device__ void produce(S& s, const CUtensorMap* x_map, const CUtensorMap* w_map,
                        const float* row_scale, int64_t classes, int64_t row0, TileRange range) {
  constexpr int kKBlocks = sizeof(S::x) / sizeof(S::x[0]);
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    barrier_arrive_expect(&s.x_full, S::kXBytes);
    for (int kb = 0; kb < kKBlocks; ++kb)
      tma_load_2d(s.x[kb], x_map, kb * kSwizzleElements, static_cast<int>(row0), &s.x_full);
  }
  int it = 0;
  for (int64_t tile = range.first; tile < range.last; ++tile) {
    const int64_t n = tile - range.first;
    float scale[kTile / 32];
    if (row_scale != nullptr) {
#pragma unroll
      for (int e = 0; e < kTile / 32; ++e) {
        const int64_t j = tile * kTile + lane * (kTile / 32) + e;
        scale[e] = j < classes ? row_scale[j] : 0.0f;
      }
    }
    for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
      const int stage = it % S::kStages;
      const int round = it / S::kStages;
      if (round > 0) barrier_wait(&s.empty[stage], (round - 1) & 1);
      if (lane == 0) {
        barrier_arrive_expect(&s.full[stage], S::kStageBytes);
        tma_load_2d(s.w[stage], w_map, kb * kSwizzleElements, static_cast<int>(tile * kTile),
                    &s.full[stage]);
      }
    }
    if (row_scale != nullptr) {
      const int slot = static_cast<int>(n & 1);
      if (n >= 2) barrier_wait(&s.scale_empty[slot], ((n >> 1) - 1) & 1);
#pragma unroll
      for (int e = 0; e < kTile / 32; ++e) s.scale[slot][lane * (kTile / 32) + e] = scale[e];
      barrier_arrive(&s.scale_full[slot]);  // releases this lane's stores
    }
  }
}

// What a kernel reads and writes besides the operands. Statistics: group_max, group_sum,
// target_logit; keeping the exponentials also target_cos, `matrix` and each sample's `reference`
// (z units). Gradient: row_max, row_inv_sum, coef in, `matrix` (the logits' gradient) out, where
// `gate` is null or non-zero.
struct Io {
  const float* row_scale;
  const int64_t* target_col;
  int64_t begin;
  float* group_max;
  float* group_sum;
  float* target_logit;
  float* target_cos;
  const float* row_max;
  const float* row_inv_sum;
  const float* coef;
  __nv_bfloat16* matrix;
  const int* gate;
  const float* reference;
};

// A consumer warpgroup takes every other tile of the range for all 128 rows of the CTA, as two
// m64 halves; while one warpgroup's products run on the tensor cores, the other works on its
// last tile. A thread holds 4 rows (r: half r / 2, fragment row r % 2) and a quarter of each
// tile's columns. Logits are handled in units of v = z / unit (the clamped cosine for
// normalised classes), so that an exponent is one fused multiply-add:
// exp(z - m) = 2^(v * unit * log2 e - m * log2 e).
template <int kKBlocks, Pass kPass>
struct Consumer {
  static constexpr bool kGrad = kPass == Pass::kGradient;
  Shared<kKBlocks, kPass>& s;
  int warpgroup, t;
  int64_t classes, batch;
  MarginParams params;
  Io io;
  float unit;                  // z per v, and dz/dcos off the target
  const CUtensorMap* out_map;  // gradient: the bulk stores' map, or null for stores from registers
  int64_t row0 = 0;
  int64_t row[4], target[4];
  // Statistics: the running max (v units) and sum. Gradient: the row's max in z units times
  // log2 e, and 1 / the row's sum of exponentials.
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sum[4] = {0, 0, 0, 0};
  float coef = 0.0f;   // gradient: the incoming gradient over the batch size
  float reference[4];  // forward: each row's reference in z units times log2 e

  static __device__ __forceinline__ int row_of(int q, int i) { return 2 * q + (i / 2) % 2; }

  __device__ void start(int64_t first_row) {
    row0 = first_row;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      row[r] = row0 + 64 * (r / 2) + fragment_row(t, 2 * (r % 2));
      // A target past the last class (the next chunk's) must not match a padded column of
      // the last tile.
      const int64_t col = row[r] < batch ? io.target_col[row[r]] - io.begin : -1;
      target[r] = col < classes ? col : -1;
      if (kGrad && row[r] < batch) {
        m[r] = io.row_max[row[r]] * kLog2e;
        sum[r] = io.row_inv_sum[row[r]];
      }
      // A normalising margin's reference is s, known to the statistics pass as well.
      if constexpr (kPass != Pass::kGradient)
        reference[r] =
            (kPass == Pass::kKeep && row[r] < batch ? io.reference[row[r]] : unit) * kLog2e;
    }
    if (kGrad) coef = *io.coef;
  }

  // Tile n's products into acc, releasing each weight stage as soon as its products are done.
  // The products are issued after the other warpgroup has issued its own tile's.
  __device__ __forceinline__ void multiply(float (&acc)[2][64], int64_t n, int64_t tiles) {
    using S = Shared<kKBlocks, kPass>;
    named_sync(kTurnBarrier + warpgroup, kConsumers);
    int it = static_cast<int>(n) * kKBlocks;
    int previous = -1;
#pragma unroll
    for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
      const int stage = it % S::kStages;
      barrier_wait(&s.full[stage], (it / S::kStages) & 1);
      const uint64_t b = descriptor_k_major_sw128(s.w[stage]);
      wgmma_k_block(
          acc, [&](int q) { return descriptor_k_major_sw128(&s.x[kb][q * 64 * kSwizzleElements]); },
          [&](int) { return b; }, kb > 0);
      if (previous >= 0 && t == 0) barrier_arrive(&s.empty[previous]);
      previous = stage;
    }
    if (n + 1 < tiles) named_arrive(kTurnBarrier + 1 - warpgroup, kConsumers);
    wgmma_wait<0>();
    fence_registers(acc);
    if (t == 0) barrier_arrive(&s.empty[previous]);
  }

  // The tile's 1/|w_j| (null when the rows are normalised), once the producer has staged them.
  __device__ __forceinline__ const float* scales(int64_t n) {
    if (io.row_scale == nullptr) return nullptr;
    barrier_wait(&s.scale_full[warpgroup], (n >> 1) & 1);
    return s.scale[warpgroup];
  }
  __device__ __forceinline__ void release_scales() {
    if (io.row_scale == nullptr) return;
    __syncwarp();
    if (t % 32 == 0) barrier_arrive(&s.scale_empty[warpgroup]);
  }

  // Multiplies column pairs of acc by (x, y) of f(column).
  template <class F>
  __device__ __forceinline__ void scale_columns(float (&acc)[2][64], F f) {
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const float2 c = f(fragment_col(t, i));
#pragma unroll
      for (int q = 0; q < 2; ++q) acc[q][i] *= c.x, acc[q][i + 1] *= c.y;
    }
  }

  // The tile's products in v units; columns past the last class are -inf.
  __device__ __forceinline__ void to_units(float (&acc)[2][64], int64_t tile, const float* scale) {
    if (scale != nullptr)
      scale_columns(acc, [&](int c) { return *reinterpret_cast<const float2*>(scale + c); });
    if (params.normalized) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[q][i] = fminf(1.0f, fmaxf(-1.0f, acc[q][i]));
    }
    const int64_t first = tile * kTile;
    if (first + kTile > classes) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 64; ++i)
          if (first + fragment_col(t, i) >= classes) acc[q][i] = -INFINITY;
    }
  }

  // The column of row r's target when it falls in this tile and this thread's columns, else -1.
  __device__ __forceinline__ int target_column(int r, int64_t tile) const {
    const int64_t c = target[r] - tile * kTile;
    return c >= 0 && c < kTile && ((c >> 1) & 3) == t % 4 ? static_cast<int>(c) : -1;
  }

  // Reads (or with `write`, replaces) the element of row r at column col.
  __device__ __forceinline__ float element(float (&acc)[2][64], int r, int col, bool write,
                                           float value) const {
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 64; ++i)
        if (row_of(q, i) == r && fragment_col(t, i) == col) {
          v = acc[q][i];
          if (write) acc[q][i] = value;
        }
    return v;
  }

  // Statistics: the margin on a target that falls here, then the online max and sum of
  // exponentials per row; with kKeep, the tile's exponentials as well.
  __device__ __forceinline__ void statistics(float (&acc)[2][64], int64_t tile, int64_t n) {
    const float* scale = scales(n);
    to_units(acc, tile, scale);
    if constexpr (kPass == Pass::kStatistics) release_scales();
    margin_targets(acc, tile);
    float top[4] = {m[0], m[1], m[2], m[3]};
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 64; ++i) top[row_of(q, i)] = fmaxf(top[row_of(q, i)], acc[q][i]);
    const float k = unit * kLog2e;
    float shift[4], part[4] = {0, 0, 0, 0};
#pragma unroll
    for (int r = 0; r < 4; ++r) shift[r] = top[r] == -INFINITY ? 0.0f : top[r] * k;
    const bool from_reference = sums_from_reference(shift);
    if (from_reference) {
      exponentials(acc);
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 64; ++i) part[row_of(q, i)] += acc[q][i];
#pragma unroll
      for (int r = 0; r < 4; ++r) part[r] *= exp2_approx(reference[r] - shift[r]);
    } else {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int i = 0; i < 64; ++i)
          part[row_of(q, i)] += exp2_approx(fmaf(acc[q][i], k, -shift[row_of(q, i)]));
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float keep = m[r] == -INFINITY ? 0.0f : exp2_approx(m[r] * k - shift[r]);
      sum[r] = fmaf(sum[r], keep, part[r]);
      m[r] = top[r];
    }
    if constexpr (kPass == Pass::kKeep) {
      if (!from_reference) exponentials(acc);
      keep_exponentials(acc, tile, scale);
    }
  }

  // The margin on each target that falls in this tile (rare: one tile of all per row), its logit
  // written out and its element replaced.
  __device__ __forceinline__ void margin_targets(float (&acc)[2][64], int64_t tile) {
    int col[4];
    bool mine = false;
#pragma unroll
    for (int r = 0; r < 4; ++r) mine |= (col[r] = target_column(r, tile)) >= 0;
    if (!__any_sync(0xffffffff, mine)) return;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (col[r] < 0) continue;
      float z, unused;
      const float cos = element(acc, r, col[r], false, 0.0f);
      margin_target(cos, params, &z, &unused);
      io.target_logit[row[r]] = z;
      if constexpr (kPass == Pass::kKeep) io.target_cos[row[r]] = cos;
      element(acc, r, col[r], true, z / unit);
    }
  }

  // Whether this warp sums the tile from the exponentials against the reference, scaled to the
  // running max: then keeping them costs no second exponential. Only a normalising margin's,
  // whose reference both forward passes know, so their statistics agree bit for bit. What flushes
  // to zero lies 126 below the reference (log2 units); within kSumDepth of it, that is 48 below
  // the running max, under the sum's float rounding for up to 2^24 classes.
  __device__ __forceinline__ bool sums_from_reference(const float (&shift)[4]) const {
    constexpr float kSumDepth = 78.0f;
    bool shallow = params.normalized;
#pragma unroll
    for (int r = 0; r < 4; ++r) shallow = shallow && reference[r] - shift[r] <= kSumDepth;
    return __all_sync(0xffffffff, shallow);
  }

  // exp(z - r) for every logit of the tile, in place (in v units, 2^(v unit log2 e - r log2 e)).
  __device__ __forceinline__ void exponentials(float (&acc)[2][64]) const {
    const float k = unit * kLog2e;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 64; ++i)
        acc[q][i] = exp2_approx(fmaf(acc[q][i], k, -reference[row_of(q, i)]));
  }

  // The tile's exponentials (exponentials()) over |w_j|, written like the gradient. The reference
  // r bounds every z off the target, so nothing overflows; what underflows lies more than 87
  // below r, which backward checks for every row (kKeptMaxDepth). A target's element is replaced
  // in backward.
  __device__ __forceinline__ void keep_exponentials(float (&acc)[2][64], int64_t tile,
                                                    const float* scale) {
    if (scale != nullptr)
      scale_columns(acc, [&](int c) { return *reinterpret_cast<const float2*>(scale + c); });
    release_scales();
    write_matrix(acc, tile);
  }

  // Gradient: d loss / d cos times 1/|w_j|, coef (softmax - one-hot) dz/dcos / |w_j|, written
  // class-major in bf16.
  __device__ __forceinline__ void gradient(float (&acc)[2][64], int64_t tile, int64_t n) {
    const float* scale = scales(n);
    to_units(acc, tile, scale);
    // The targets' gradients first, from their cosines, before the elements are overwritten.
    int col[4];
    float target_grad[4];
    bool mine = false;
#pragma unroll
    for (int r = 0; r < 4; ++r) mine |= (col[r] = target_column(r, tile)) >= 0;
    const bool any = __any_sync(0xffffffff, mine);
    if (any) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (col[r] < 0) continue;
        float z, dz_dcos;
        margin_target(element(acc, r, col[r], false, 0.0f), params, &z, &dz_dcos);
        const float p = exp2_approx(fmaf(z, kLog2e, -m[r])) * sum[r];
        target_grad[r] = coef * (p - 1.0f) * dz_dcos;
      }
    }
    const float k = unit * kLog2e;
    float factor[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) factor[r] = coef * sum[r] * unit;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int r = row_of(q, i);
        acc[q][i] = exp2_approx(fmaf(acc[q][i], k, -m[r])) * factor[r];
      }
    if (any) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (col[r] >= 0) element(acc, r, col[r], true, target_grad[r]);
    }
    if (scale != nullptr)
      scale_columns(acc, [&](int c) { return *reinterpret_cast<const float2*>(scale + c); });
    release_scales();
    write_matrix(acc, tile);
  }

  __device__ __forceinline__ void write_matrix(const float (&acc)[2][64], int64_t tile) {
    if (out_map != nullptr)
      store_staged(acc, tile);
    else
      store(acc, tile);
  }

  // The tile's gradients through shared memory in four boxes of 64 classes x 64 samples, with
  // bulk tensor stores, which clip what lies past the last class or sample. One box per
  // warpgroup: two would cost the weight ring a stage, and measured no faster. A box holds a
  // class per 128-byte row, its 16-byte chunks swizzled by the class's index mod 8, so that
  // stmatrix's 8 rows of a matrix land in 8 different chunks.
  __device__ __forceinline__ void store_staged(const float (&acc)[2][64], int64_t tile) {
    const int lane = t % 32, matrix = lane / 8;
    // This lane's row of the stored matrices: class 8 (block) + lane % 8 of the box, samples
    // 16 warp + 8 (matrix % 2) on, for blocks 2 x and 2 x + 1 (matrix / 2) of each x4.
    const int chunk = 2 * (t / 32) + matrix % 2;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint8_t* buffer = reinterpret_cast<uint8_t*>(s.out.box[warpgroup]);
        if (t == 0) bulk_wait_read<0>();
        named_sync(kStagingBarrier + warpgroup, kWarpgroup);
#pragma unroll
        for (int x = 4 * half; x < 4 * half + 4; ++x) {
          const int c = 8 * (2 * x + matrix / 2) % 64 + lane % 8;
          uint32_t r[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const __nv_bfloat162 pair =
                __floats2bfloat162_rn(acc[q][8 * x + 2 * k], acc[q][8 * x + 2 * k + 1]);
            r[k] = *reinterpret_cast<const uint32_t*>(&pair);
          }
          stmatrix_x4_trans(buffer + c * 128 + ((chunk ^ (c & 7)) << 4), r[0], r[1], r[2], r[3]);
        }
        fence_async_shared();
        named_sync(kStagingBarrier + warpgroup, kWarpgroup);
        if (t == 0) {
          tma_store_2d(out_map, static_cast<int>(row0 + 64 * q),
                       static_cast<int>(tile * kTile + 64 * half), buffer);
          bulk_commit();
        }
      }
  }

  // The same from registers, where the batch is not a multiple of 8 (a tensor map's rows must
  // be 16-byte multiples).
  __device__ __forceinline__ void store(const float (&acc)[2][64], int64_t tile) const {
    const int64_t first = tile * kTile;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int64_t j = first + fragment_col(t, i);
        const int64_t b = row[row_of(q, i)];
        if (j < classes && b < batch) io.matrix[j * batch + b] = __float2bfloat16(acc[q][i]);
      }
  }

  __device__ void run(TileRange range) {
    const int64_t tiles = range.last - range.first;
    // The first warpgroup issues first.
    if (warpgroup == 1) named_arrive(kTurnBarrier, kConsumers);
    for (int64_t n = warpgroup; n < tiles; n += 2) {
      float acc[2][64];
      multiply(acc, n, tiles);
      if constexpr (kGrad)
        gradient(acc, range.first + n, n);
      else
        statistics(acc, range.first + n, n);
    }
  }

  // (m, sum) merged with (other_m, other_sum), both in v units.
  __device__ static void merge(float& m, float& sum, float other_m, float other_sum, float k) {
    const float top = fmaxf(m, other_m);
    if (top == -INFINITY) return;
    sum = (m == -INFINITY ? 0.0f : sum * exp2_approx((m - top) * k)) +
          (other_m == -INFINITY ? 0.0f : other_sum * exp2_approx((other_m - top) * k));
    m = top;
  }

  // Statistics: the four threads of a row merge their columns', then the second warpgroup's
  // meet the first's, in a fixed order; the first writes them in z units.
  __device__ void write_statistics(int64_t part) {
    const float k = unit * kLog2e;
#pragma unroll
    for (int r = 0; r < 4; ++r)
      for (int offset = 1; offset < 4; offset *= 2)
        merge(m[r], sum[r], __shfl_xor_sync(0xffffffff, m[r], offset),
              __shfl_xor_sync(0xffffffff, sum[r], offset), k);
    const int local = (t / 32) * 16 + (t % 32) / 4;  // fragment row 0 of this thread
    if (warpgroup == 1 && t % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 4; ++r) s.merge[local + 8 * (r % 2) + 64 * (r / 2)] = {m[r], sum[r]};
    }
    named_sync(kMergeBarrier, kConsumers);
    if (warpgroup == 1 || t % 4 != 0) return;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float2 other = s.merge[local + 8 * (r % 2) + 64 * (r / 2)];
      merge(m[r], sum[r], other.x, other.y, k);
      if (row[r] < batch) {
        io.group_max[part * batch + row[r]] = m[r] * unit;
        io.group_sum[part * batch + row[r]] = sum[r];
      }
    }
  }
};

template <int kKBlocks, Pass kPass>
__global__ void __launch_bounds__(kThreads, 1)
    fused_softmax_kernel(const __grid_constant__ CUtensorMap x_map,
                         const __grid_constant__ CUtensorMap w_map,
                         const __grid_constant__ CUtensorMap out_map, bool staged, int64_t classes,
                         int64_t batch, MarginParams params, int lanes, Io io) {
  // A gate decided on the device (backward from kept exponentials falls back to this kernel for
  // deep rows) spares the host a synchronisation; every thread of the grid leaves alike.
  if (io.gate != nullptr && *io.gate == 0) return;
  using S = Shared<kKBlocks, kPass>;
  S& s = shared_storage<S>();
  const int row_blocks = static_cast<int>(gridDim.x) / lanes;
  const int64_t row0 = int64_t{static_cast<int>(blockIdx.x) % row_blocks} * kRows;
  const int lane = static_cast<int>(blockIdx.x) / row_blocks;
  const TileRange range = lane_tiles((classes + kTile - 1) / kTile, lane, lanes);
  if (threadIdx.x == 0) {
    barrier_init(&s.x_full, 1);
    for (int i = 0; i < S::kStages; ++i) {
      barrier_init(&s.full[i], 1);
      barrier_init(&s.empty[i], 1);  // the warpgroup that took the stage's tile
    }
    for (int i = 0; i < 2; ++i) {
      barrier_init(&s.scale_full[i], 32);                // every producer lane
      barrier_init(&s.scale_empty[i], kWarpgroup / 32);  // every warp of the warpgroup
    }
    barrier_init_fence();
  }
  __syncthreads();
  // The producer's registers go to the consumers, which hold a tile's accumulators.
  if (threadIdx.x >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x < kConsumers + 32)
      produce(s, &x_map, &w_map, io.row_scale, classes, row0, range);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    Consumer<kKBlocks, kPass> c{s,
                                static_cast<int>(threadIdx.x / kWarpgroup),
                                static_cast<int>(threadIdx.x % kWarpgroup),
                                classes,
                                batch,
                                params,
                                io,
                                params.normalized ? params.scale : 1.0f,
                                staged ? &out_map : nullptr};
    c.start(row0);
    barrier_wait(&s.x_full, 0);
    c.run(range);
    if constexpr (kPass != Pass::kGradient) c.write_statistics(lane);
    // The shared memory that bulk stores read lives until they have read it.
    if (staged && c.t == 0) bulk_wait();
  }
}

struct Grid {
  int row_blocks, lanes;
};
Grid grid_for(int device, int64_t batch, int64_t classes) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) sms = 1;
  // An empty batch (a micro-batch of no samples) or chunk launches nothing: one part, unwritten.
  const int64_t row_blocks = (batch + kRows - 1) / kRows;
  const int64_t tiles = (classes + kTile - 1) / kTile;
  if (row_blocks == 0 || tiles == 0) return {static_cast<int>(row_blocks), 1};
  int64_t lanes = row_blocks >= sms ? 1 : sms / row_blocks;
  if (lanes > tiles) lanes = tiles;
  return {static_cast<int>(row_blocks), static_cast<int>(lanes < 1 ? 1 : lanes)};
}

}  // namespace

bool fused_softmax_runs_on(int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return false;
  return p.major == 9 && p.minor == 0;
}

int fused_logit_parts(int device, int64_t batch, int64_t classes) {
  return grid_for(device, batch, classes).lanes;
}

namespace {

template <Pass kPass>
cudaError_t launch(const void* x, int64_t batch, const void* w, int64_t classes, int dim,
                   MarginParams params, const Io& io, cudaStream_t stream) {
  if (batch == 0 || classes == 0) return cudaSuccess;
  if (!fused_dim_fits(dim)) return cudaErrorInvalidValue;
  if (classes > (int64_t{1} << 31) - kTile || batch > (int64_t{1} << 31) - kRows)
    return cudaErrorInvalidValue;  // TMA coordinates are 32-bit
  int device = 0;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc != cudaSuccess) return rc;
  const Grid g = grid_for(device, batch, classes);
  CUtensorMap x_map, w_map, out_map{};
  rc = matrix_map(&x_map, x, batch, dim, kRows);
  if (rc == cudaSuccess) rc = matrix_map(&w_map, w, classes, dim, kTile);
  // The matrix [classes, batch] in boxes of 64 samples x 64 classes, where its rows are 16-byte
  // multiples.
  const bool staged = writes_matrix(kPass) && batch % 8 == 0;
  if (rc == cudaSuccess && staged)
    rc = matrix_map(&out_map, io.matrix, classes, static_cast<int>(batch), 64);
  if (rc != cudaSuccess) return rc;
  const auto run = [&](auto blocks) {
    constexpr int kKBlocks = decltype(blocks)::value;
    const auto kernel = fused_softmax_kernel<kKBlocks, kPass>;
    const size_t shared = sizeof(Shared<kKBlocks, kPass>) + kSwizzleAtomBytes;
    const cudaError_t set = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (set != cudaSuccess) return set;
    kernel<<<g.row_blocks * g.lanes, kThreads, shared, stream>>>(
        x_map, w_map, out_map, staged, classes, batch, params, g.lanes, io);
    return cudaGetLastError();
  };
  switch ((dim + kSwizzleElements - 1) / kSwizzleElements) {
    case 1:
      return run(std::integral_constant<int, 1>{});
    case 2:
      return run(std::integral_constant<int, 2>{});
    case 3:
      return run(std::integral_constant<int, 3>{});
    case 4:
      return run(std::integral_constant<int, 4>{});
    case 5:
      return run(std::integral_constant<int, 5>{});
    case 6:
      return run(std::integral_constant<int, 6>{});
    case 7:
      return run(std::integral_constant<int, 7>{});
    default:
      return run(std::integral_constant<int, 8>{});
  }
}

}  // namespace

cudaError_t fused_logit_stats(const void* x, int64_t batch, const void* w, const float* row_scale,
                              int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                              MarginParams params, float* group_max, float* group_sum,
                              float* target_logit, float* target_cos, void* kept,
                              const float* reference, cudaStream_t stream) {
  const Io io{row_scale,
              target_col,
              begin,
              group_max,
              group_sum,
              target_logit,
              target_cos,
              nullptr,
              nullptr,
              nullptr,
              static_cast<__nv_bfloat16*>(kept),
              nullptr,
              reference};
  if (kept == nullptr)
    return launch<Pass::kStatistics>(x, batch, w, classes, dim, params, io, stream);
  if (target_cos == nullptr || reference == nullptr) return cudaErrorInvalidValue;
  return launch<Pass::kKeep>(x, batch, w, classes, dim, params, io, stream);
}

cudaError_t fused_logit_grad(const void* x, int64_t batch, const void* w, const float* row_scale,
                             int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                             const float* row_max, const float* row_inv_sum, const float* coef,
                             MarginParams params, void* logit_grad, const int* gate,
                             cudaStream_t stream) {
  const Io io{row_scale,
              target_col,
              begin,
              nullptr,
              nullptr,
              nullptr,
              nullptr,
              row_max,
              row_inv_sum,
              coef,
              static_cast<__nv_bfloat16*>(logit_grad),
              gate,
              nullptr};
  return launch<Pass::kGradient>(x, batch, w, classes, dim, params, io, stream);
}

namespace {

// One thread per sample: a row whose max lies deeper than kKeptMaxDepth below its reference
// raises *deep.
__global__ void kept_depth_kernel(int64_t batch, const float* row_max, const float* reference,
                                  int* deep) {
  const int64_t b = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (b < batch && row_max[b] < reference[b] - kKeptMaxDepth) *deep = 1;
}

// One thread per sample: its factor, and its target's element replaced by the gradient over the
// factor, so that the products read the gradient there too. Where a row is deep, every factor is
// 1: the gated gradient kernel then writes the whole gradient over the kept matrix.
__global__ void kept_finish_kernel(__nv_bfloat16* kept, int64_t batch, int64_t classes,
                                   const float* row_scale, const int64_t* target_col, int64_t begin,
                                   const float* target_cos, const float* row_max,
                                   const float* row_inv_sum, const float* coef,
                                   const float* reference, MarginParams params, float* factor,
                                   const int* deep) {
  const int64_t b = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  if (*deep != 0) {
    factor[b] = 1.0f;
    return;
  }
  // Off the target dz/dcos is u = s (1 for plain softmax); with r the sample's reference,
  // coef softmax u = coef exp(z - max) / sum u = exp(z - r) (coef u exp(r - max) / sum).
  const float unit = params.normalized ? params.scale : 1.0f;
  const float f = *coef * unit * expf(reference[b] - row_max[b]) * row_inv_sum[b];
  factor[b] = f;
  const int64_t col = target_col[b] - begin;
  if (col < 0 || col >= classes) return;
  float z, dz_dcos;
  margin_target(target_cos[b], params, &z, &dz_dcos);
  const float p = expf(z - row_max[b]) * row_inv_sum[b];
  float g = *coef * (p - 1.0f) * dz_dcos;
  if (row_scale != nullptr) g *= row_scale[col];
  // A zero upstream gradient makes the whole row's gradient zero, the target's included (not 0/0).
  kept[col * batch + b] = __float2bfloat16(f == 0.0f ? 0.0f : g / f);
}

}  // namespace

cudaError_t kept_finish(void* kept, int64_t batch, int64_t classes, const float* row_scale,
                        const int64_t* target_col, int64_t begin, const float* target_cos,
                        const float* row_max, const float* row_inv_sum, const float* coef,
                        const float* reference, MarginParams params, float* factor, int* deep,
                        cudaStream_t stream) {
  if (reference == nullptr) return cudaErrorInvalidValue;
  cudaError_t rc = cudaMemsetAsync(deep, 0, sizeof(int), stream);
  if (rc != cudaSuccess || batch == 0) return rc;
  constexpr int kBlock = 256;
  const auto blocks = static_cast<unsigned>((batch + kBlock - 1) / kBlock);
  kept_depth_kernel<<<blocks, kBlock, 0, stream>>>(batch, row_max, reference, deep);
  rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  kept_finish_kernel<<<blocks, kBlock, 0, stream>>>(
      static_cast<__nv_bfloat16*>(kept), batch, classes, row_scale, target_col, begin, target_cos,
      row_max, row_inv_sum, coef, reference, params, factor, deep);
  return cudaGetLastError();
}

}  // namespace myriad::cuda
