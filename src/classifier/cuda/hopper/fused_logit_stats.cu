// The fused forward of the sharded margin softmax on Hopper: logits x̂·Ŵᵀ computed tile by tile
// with wgmma, scaled, margined and reduced to per-row softmax statistics in registers; only the
// statistics and the target logits reach memory. The layout of the statistics is chunk_stats':
// [groups, batch], so the combine and the cross-rank reduction stay as they are.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdint>

#include "fused_logit_stats.h"
#include "hopper.cuh"

namespace myriad::cuda {

namespace {

using namespace hopper;

constexpr int kRows = 128;     // samples per CTA: two consumer warpgroups of 64
constexpr int kClasses = 128;  // classes per MMA tile
constexpr int kStages = 4;     // weight tiles in flight
constexpr int kMaxKBlocks = kFusedMaxDim / kSwizzleElements;
constexpr int kConsumers = 256;
constexpr int kThreads = kConsumers + 128;  // and one producer warpgroup
constexpr int kBoxBytes = kRows * kSwizzleElements * 2;  // == kClasses * 64 * 2

struct Shared {
  __nv_bfloat16 x[kMaxKBlocks][kRows * kSwizzleElements];
  __nv_bfloat16 w[kStages][kClasses * kSwizzleElements];
  uint64_t x_full;
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr size_t kSharedBytes = sizeof(Shared) + kSwizzleAtomBytes;  // and its alignment

__device__ inline Shared& shared_storage() {
  extern __shared__ uint8_t raw[];
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  return *reinterpret_cast<Shared*>((base + kSwizzleAtomBytes - 1) & ~uintptr_t{kSwizzleAtomBytes - 1});
}

// The producer: x̂'s rows once, then every weight tile of the group through the stage ring.
__device__ void produce(Shared& s, const CUtensorMap* x_map, const CUtensorMap* w_map, int k_blocks,
                        int64_t row0, int64_t class0, int tiles) {
  barrier_arrive_expect(&s.x_full, k_blocks * kBoxBytes);
  for (int kb = 0; kb < k_blocks; ++kb)
    tma_load_2d(s.x[kb], x_map, kb * kSwizzleElements, static_cast<int>(row0), &s.x_full);
  int it = 0;
  for (int t = 0; t < tiles; ++t) {
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int stage = it % kStages;
      const int round = it / kStages;
      if (round > 0) barrier_wait(&s.empty[stage], (round - 1) & 1);
      barrier_arrive_expect(&s.full[stage], kBoxBytes);
      tma_load_2d(s.w[stage], w_map, kb * kSwizzleElements,
                  static_cast<int>(class0 + int64_t{t} * kClasses), &s.full[stage]);
    }
  }
}

// Pins the compiler's reads and writes of `acc` at this point: the registers that an earlier
// wgmma writes asynchronously are read only after the wait that precedes this.
__device__ inline void fence_registers(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// A consumer thread of a warpgroup: 2 rows of the CTA's 128, 32 of each tile's 128 columns. Two
// accumulator sets alternate: while the tensor cores compute one tile, the thread reduces the
// previous one, a chunk per K block.
template <int kKBlocks>
struct Consumer {
  Shared& s;
  int warpgroup, t;
  const float* row_scale;
  int64_t classes, class0;
  MarginParams params;
  int64_t row[2], target[2];
  float* target_logit;
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  int it = 0;        // K blocks consumed, over all tiles
  int previous = 0;  // the stage of the last group committed

  // Registers of a K block's chunk of the reduction: [begin, end) of the 64.
  static constexpr int kChunk = (64 + kKBlocks - 1) / kKBlocks;

  // Issues tile `tile`'s products into `mma`, reducing `done` (the previous tile, `done_tile`)
  // meanwhile, unless this is the first tile. Compile-time branches only: a data-dependent one
  // around the wgmmas makes ptxas serialise them.
  template <bool kFirst>
  __device__ __forceinline__ void step(float (&mma)[64], float (&done)[64], int done_tile) {
    // Measured: without this, a tile computed into registers that held an earlier tile's reduced
    // logits comes out wrong though its first wgmma does not accumulate (scale-d false).
#pragma unroll
    for (int i = 0; i < 64; ++i) mma[i] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
      const int stage = it % kStages;
      barrier_wait(&s.full[stage], (it / kStages) & 1);
      wgmma_fence();
      const uint64_t a = descriptor_k_major_sw128(&s.x[kb][warpgroup * 64 * kSwizzleElements]);
      const uint64_t b = descriptor_k_major_sw128(s.w[stage]);
#pragma unroll
      for (int k = 0; k < kSwizzleElements / 16; ++k)
        wgmma_m64n128k16_bf16(mma, a + k * kDescriptorK16Step, b + k * kDescriptorK16Step,
                              kb > 0 || k > 0);
      wgmma_commit();
      // Every group but this one is done: the last stage may be overwritten, and at the first K
      // block the previous tile's products are complete.
      wgmma_wait<1>();
      if (!kFirst || kb > 0) barrier_arrive(&s.empty[previous]);
      previous = stage;
      if (!kFirst) {
        if (kb == 0) fence_registers(done);
        reduce(done, done_tile, kb * kChunk, (kb + 1) * kChunk);
      }
    }
  }

  // The last tile's products, then their reduction.
  __device__ __forceinline__ void finish(float (&acc)[64], int tile) {
    wgmma_wait<0>();
    fence_registers(acc);
    barrier_arrive(&s.empty[previous]);
    reduce(acc, tile, 0, 64);
  }

  // Registers [begin, end) of a tile: cosine, margin on the target, online statistics per row.
  // The callers' loops are unrolled, so that the bounds are constants here.
  __device__ __forceinline__ void reduce(float (&acc)[64], int tile, int begin, int end) {
    const int64_t first = class0 + int64_t{tile} * kClasses;
    float top[2] = {m[0], m[1]};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (i < begin || i >= end) continue;
      const int h = (i / 2) % 2;
      const int64_t j = first + fragment_col(t, i);
      float z = -INFINITY;
      if (j < classes) {
        const float cosine = acc[i] * (row_scale != nullptr ? row_scale[j] : 1.0f);
        if (j == target[h]) {
          float unused;
          margin_target(cosine, params, &z, &unused);
          target_logit[row[h]] = z;
        } else {
          z = margin_other(cosine, params);
        }
      }
      acc[i] = z;
      top[h] = fmaxf(top[h], z);
    }
    float part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (i < begin || i >= end) continue;
      const int h = (i / 2) % 2;
      part[h] += __expf(acc[i] - top[h]);
    }
    for (int h = 0; h < 2; ++h) {
      if (top[h] == -INFINITY) continue;  // no class yet
      sum[h] = sum[h] * __expf(m[h] - top[h]) + part[h];
      m[h] = top[h];
    }
  }
};

template <int kKBlocks>
__device__ void consume(Shared& s, int tiles, const float* row_scale, int64_t classes,
                        int64_t batch, int64_t row0, int64_t class0,
                        const int64_t* target_col, int64_t begin, MarginParams params,
                        int64_t group, float* group_max, float* group_sum, float* target_logit) {
  Consumer<kKBlocks> c{s, static_cast<int>(threadIdx.x / 128), static_cast<int>(threadIdx.x % 128),
                       row_scale, classes, class0, params};
  c.target_logit = target_logit;
  for (int h = 0; h < 2; ++h) {
    c.row[h] = row0 + c.warpgroup * 64 + fragment_row(c.t, 2 * h);
    c.target[h] = c.row[h] < batch ? target_col[c.row[h]] - begin : -1;
  }
  float a[64], b[64];
  barrier_wait(&s.x_full, 0);
  c.template step<true>(a, b, 0);
  int tile = 1;
  for (; tile + 1 < tiles; tile += 2) {
    c.template step<false>(b, a, tile - 1);
    c.template step<false>(a, b, tile);
  }
  if (tile < tiles) {
    c.template step<false>(b, a, tile - 1);
    c.finish(b, tile);
  } else {
    c.finish(a, tile - 1);
  }
  // The four threads of a row merge their columns' statistics, in a fixed order.
  for (int h = 0; h < 2; ++h) {
    for (int offset = 1; offset < 4; offset *= 2) {
      const float other_m = __shfl_xor_sync(0xffffffff, c.m[h], offset);
      const float other_sum = __shfl_xor_sync(0xffffffff, c.sum[h], offset);
      const float top = fmaxf(c.m[h], other_m);
      if (top != -INFINITY) {
        c.sum[h] = c.sum[h] * __expf(c.m[h] - top) + other_sum * __expf(other_m - top);
        c.m[h] = top;
      }
    }
    if (c.t % 4 == 0 && c.row[h] < batch) {
      group_max[group * batch + c.row[h]] = c.m[h];
      group_sum[group * batch + c.row[h]] = c.sum[h];
    }
  }
}

template <int kKBlocks>
__global__ void __launch_bounds__(kThreads, 1)
    fused_logit_stats_kernel(const __grid_constant__ CUtensorMap x_map,
                             const __grid_constant__ CUtensorMap w_map,
                             const float* __restrict__ row_scale, int64_t classes, int64_t batch,
                             const int64_t* __restrict__ target_col, int64_t begin,
                             MarginParams params, int tiles_per_group,
                             float* __restrict__ group_max, float* __restrict__ group_sum,
                             float* __restrict__ target_logit) {
  Shared& s = shared_storage();
  const int64_t row0 = int64_t{blockIdx.x} * kRows;
  const int64_t group = blockIdx.y;
  const int64_t class0 = group * tiles_per_group * kClasses;
  const int64_t left = (classes - class0 + kClasses - 1) / kClasses;
  const int tiles = static_cast<int>(left < tiles_per_group ? left : tiles_per_group);
  if (threadIdx.x == 0) {
    barrier_init(&s.x_full, 1);
    for (int i = 0; i < kStages; ++i) {
      barrier_init(&s.full[i], 1);
      barrier_init(&s.empty[i], kConsumers);
    }
    barrier_init_fence();
  }
  __syncthreads();
  // The producer's registers go to the consumers, which hold two tiles' accumulators.
  if (threadIdx.x >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == kConsumers) produce(s, &x_map, &w_map, kKBlocks, row0, class0, tiles);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  consume<kKBlocks>(s, tiles, row_scale, classes, batch, row0, class0, target_col, begin, params,
                    group, group_max, group_sum, target_logit);
}

// A 2-D tensor map over a row-major bf16 matrix [rows, dim], in boxes of 64 elements x box_rows
// with the 128-byte swizzle; what lies outside the matrix reads as zeros.
cudaError_t make_map(CUtensorMap* map, const void* data, int64_t rows, int dim, int box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult found;
    const cudaError_t rc = cudaGetDriverEntryPointByVersion(
        "cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000, cudaEnableDefault,
        &found);
    if (rc != cudaSuccess) return rc;
    if (found != cudaDriverEntryPointSuccess) return cudaErrorSymbolNotFound;
  }
  const cuuint64_t sizes[2] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(dim) * 2};
  const cuuint32_t box[2] = {kSwizzleElements, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult rc = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data),
                             sizes, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return rc == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

bool fused_logit_stats_applies(int device, int dim) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return false;
  return p.major == 9 && p.minor == 0 && dim % 8 == 0 && dim <= kFusedMaxDim;
}

int64_t fused_logit_groups(int64_t classes, int tiles_per_group) {
  const int64_t per_group = int64_t{tiles_per_group} * kClasses;
  return (classes + per_group - 1) / per_group;
}

cudaError_t fused_logit_stats(const void* x, int64_t batch, const void* w, const float* row_scale,
                              int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                              MarginParams params, int tiles_per_group, float* group_max,
                              float* group_sum, float* target_logit, cudaStream_t stream) {
  if (batch == 0 || classes == 0) return cudaSuccess;
  if (dim % 8 != 0 || dim > kFusedMaxDim || tiles_per_group < 1) return cudaErrorInvalidValue;
  const int64_t groups = fused_logit_groups(classes, tiles_per_group);
  if (groups > 65535) return cudaErrorInvalidConfiguration;
  CUtensorMap x_map, w_map;
  cudaError_t rc = make_map(&x_map, x, batch, dim, kRows);
  if (rc == cudaSuccess) rc = make_map(&w_map, w, classes, dim, kClasses);
  if (rc != cudaSuccess) return rc;
  const dim3 grid(static_cast<unsigned>((batch + kRows - 1) / kRows),
                  static_cast<unsigned>(groups));
  const auto launch = [&](auto kernel) {
    const cudaError_t set = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes));
    if (set != cudaSuccess) return set;
    kernel<<<grid, kThreads, kSharedBytes, stream>>>(x_map, w_map, row_scale, classes, batch,
                                                      target_col, begin, params, tiles_per_group,
                                                      group_max, group_sum, target_logit);
    return cudaGetLastError();
  };
  switch ((dim + kSwizzleElements - 1) / kSwizzleElements) {
    case 1: return launch(fused_logit_stats_kernel<1>);
    case 2: return launch(fused_logit_stats_kernel<2>);
    case 3: return launch(fused_logit_stats_kernel<3>);
    case 4: return launch(fused_logit_stats_kernel<4>);
    case 5: return launch(fused_logit_stats_kernel<5>);
    case 6: return launch(fused_logit_stats_kernel<6>);
    case 7: return launch(fused_logit_stats_kernel<7>);
    default: return launch(fused_logit_stats_kernel<8>);
  }
}

}  // namespace myriad::cuda
