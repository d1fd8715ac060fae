// SGD with the rows' gradient formed on chip (fused_weight_update.h). A CTA owns 128 rows and 256
// columns of their gradient, g[rows, cols] = logit_grad[rows, :] x[:, cols], summed over the
// batch with wgmma from a TMA ring, two consumer warpgroups taking 64 rows each. The float32 tile
// then goes to shared memory, over the ring, and all twelve warps apply the update to whole
// stretches of rows from there: each lane 8 consecutive elements, one 16-byte access of a bf16
// row. (Updating from the accumulators' layout took 4-byte accesses from 8 warps, and ran at 0.7
// TB/s where the separate update kernel reaches 3.5.)
//
// A row's gradient with respect to the stored row needs w.g and |w|^2 over the whole row. Where
// D > 256 the two halves of a row lie in two CTAs of a cluster, which add their halves' sums
// through distributed shared memory, in one fixed order on both. Whole rows in one CTA would
// need 128 KB of accumulators per 64 rows, and tiles of 64 rows read x twice as often from L2.

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "../row_update.cuh"
#include "fused_weight_update.h"
#include "hopper.cuh"

namespace myriad::cuda {

namespace {

using namespace hopper;

constexpr int kRows = 128;       // gradient rows per CTA
constexpr int kCols = 256;       // and columns: two wgmma N blocks
constexpr int kBlockCols = 128;  // columns of one wgmma
constexpr int kHalfRows = 64;    // rows per consumer warpgroup (wgmma's M)
constexpr int kWarpgroup = 128;
constexpr int kConsumers = 2 * kWarpgroup;
constexpr int kThreads = kConsumers + kWarpgroup;
constexpr int kStages = 4;

constexpr int kWarps = kThreads / 32;
constexpr int kLaneCols = kCols / 32;   // columns per lane in the update: 8
constexpr int kTileStride = kCols + 8;  // floats per row of the staged tile: rows 8 banks apart

struct Shared {
  union {
    struct {
      // Stage: the K block of 64 samples of the CTA's logit_grad rows and of its columns of x.
      __nv_bfloat16 a[kStages][kRows * kSwizzleElements];
      __nv_bfloat16 b[kStages][2][kBlockCols * kSwizzleElements];
    } ring;
    float g[kRows][kTileStride];  // the finished tile, once the ring has been read
  };
  float2 sums[kRows];  // this half's (w.g, |w|^2) per row, for the other half of the cluster
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
static_assert(sizeof(float) * kRows * kTileStride <=
                  sizeof(__nv_bfloat16) * kStages * (kRows + 2 * kBlockCols) * kSwizzleElements,
              "the staged tile must fit in the ring");
constexpr uint32_t kStageBytes = (kRows + 2 * kBlockCols) * kSwizzleElements * 2;

struct Problem {
  int64_t count;  // rows
  int batch, dim;
  const int64_t* index;
  int64_t begin;
  RowGradient grad_of;
  SgdArgs args;
  WeightStore store;
};

// The producer's one thread: every K block's tiles through the ring.
__device__ void produce(Shared& s, const CUtensorMap* g_map, const CUtensorMap* x_map, int row0,
                        int col0, int k_blocks) {
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = kb % kStages;
    const int round = kb / kStages;
    if (round > 0) barrier_wait(&s.empty[stage], (round - 1) & 1);
    barrier_arrive_expect(&s.full[stage], kStageBytes);
    tma_load_2d(s.ring.a[stage], g_map, kb * kSwizzleElements, row0, &s.full[stage]);
    for (int q = 0; q < 2; ++q)
      tma_load_2d(s.ring.b[stage][q], x_map, kb * kSwizzleElements, col0 + q * kBlockCols,
                  &s.full[stage]);
  }
}

// A consumer warpgroup's 64 rows x 256 columns of the gradient, summed over the batch.
__device__ void multiply(Shared& s, float (&acc)[2][64], int warpgroup, int t, int k_blocks) {
  int previous = -1;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = kb % kStages;
    barrier_wait(&s.full[stage], (kb / kStages) & 1);
    const uint64_t a =
        descriptor_k_major_sw128(&s.ring.a[stage][warpgroup * kHalfRows * kSwizzleElements]);
    wgmma_k_block(
        acc, [&](int) { return a; },
        [&](int q) { return descriptor_k_major_sw128(s.ring.b[stage][q]); }, kb > 0);
    if (previous >= 0 && t == 0) barrier_arrive(&s.empty[previous]);
    previous = stage;
  }
  wgmma_wait<0>();
  fence_registers(acc);
}

// The warpgroup's accumulators into the staged tile: register i of thread t holds row
// fragment_row(t, i) and column fragment_col(t, i) of each 64 x 128 block q.
__device__ void stage(Shared& s, const float (&acc)[2][64], int warpgroup, int t) {
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int row = warpgroup * kHalfRows + fragment_row(t, i);
      *reinterpret_cast<float2*>(&s.g[row][q * kBlockCols + fragment_col(t, i)]) =
          make_float2(acc[q][i], acc[q][i + 1]);
    }
}

// A warp's share of the update: rows warp, warp + kWarps, ... of the tile, lane l taking its
// columns col0 + 8 l + [0, 8) of each.
template <typename W, typename State>
struct RowUpdate {
  Shared& s;
  W* weight;
  State* momentum;
  const Problem& p;
  int warp, lane, col0, half, halves;
  int row0;

  // Rows whose loads are in flight together: the epilogue has only twelve warps per
  // multiprocessor to hide the latency of device memory with.
  static constexpr int kAtOnce = 6;

  // What a row's update reads from device memory: this lane's weights, and with `with_momentum`
  // its momentum.
  struct Loaded {
    Pack<W, kLaneCols> w;
    Pack<State, kLaneCols> m;
  };

  __device__ int column() const { return col0 + lane * kLaneCols; }
  __device__ bool has_column() const { return column() < p.dim; }
  __device__ int64_t shard_row(int r) const {
    const int64_t row = int64_t{row0} + r;
    return p.index != nullptr ? p.index[p.begin + row] : p.begin + row;
  }
  __device__ int rows() const {
    const int64_t left = p.count - row0;
    return left < kRows ? static_cast<int>(left) : kRows;
  }
  template <class Body>
  __device__ void for_rows(bool with_momentum, Body&& body) const {
    for_each_row<kAtOnce>(
        warp, rows(), kWarps,
        [&](int64_t r) {
          Loaded l{};
          if (has_column()) {
            const int64_t at = shard_row(static_cast<int>(r)) * p.dim + column();
            l.w = load_pack<kLaneCols>(weight + at);
            if (with_momentum) l.m = load_pack<kLaneCols>(momentum + at);
          }
          return l;
        },
        [&](int64_t r, const Loaded& l) { body(static_cast<int>(r), l); });
  }
  __device__ void gradient(int r, float (&g)[kLaneCols]) const {
    const float4* from = reinterpret_cast<const float4*>(&s.g[r][lane * kLaneCols]);
    const float4 lo = from[0], hi = from[1];
    g[0] = lo.x, g[1] = lo.y, g[2] = lo.z, g[3] = lo.w, g[4] = hi.x, g[5] = hi.y, g[6] = hi.z,
    g[7] = hi.w;
  }

  // Each of the warp's rows: the sums over this CTA's columns, then over the whole row.
  __device__ void row_sums() const {
    for_rows(false, [&](int r, const Loaded& l) {
      float g[kLaneCols], dot = 0.0f, squares = 0.0f;
      gradient(r, g);
      if (has_column()) {
#pragma unroll
        for (int j = 0; j < kLaneCols; ++j) {
          const float v = to_float(l.w.e[j]);
          dot = fmaf(v, g[j], dot);
          squares = fmaf(v, v, squares);
        }
      }
      for (int offset = 16; offset > 0; offset >>= 1) {
        dot += __shfl_xor_sync(0xffffffff, dot, offset);
        squares += __shfl_xor_sync(0xffffffff, squares, offset);
      }
      if (lane == 0) s.sums[r] = make_float2(dot, squares);
    });
  }

  // Row r's sums over the whole row: half 0's plus half 1's, in that order in both CTAs, so that
  // both update the row alike.
  __device__ float2 whole_row_sums(int r) const {
    const float2 mine = s.sums[r];
    if (halves == 1) return mine;
    const float2 other = cluster_load(&s.sums[r], 1 - half);
    const float2 first = half == 0 ? mine : other, second = half == 0 ? other : mine;
    return make_float2(first.x + second.x, first.y + second.y);
  }

  __device__ void update() const {
    const WeightStore& store = p.store;
    const bool with_momentum = momentum != nullptr;
    for_rows(with_momentum, [&](int r, const Loaded& l) {
      if (!has_column()) return;
      float sums_x = 0.0f, sums_y = 0.0f;
      if (p.grad_of != RowGradient::kRow) {
        const float2 sums = whole_row_sums(r);
        sums_x = sums.x, sums_y = sums.y;
      }
      const RowGradientOf dw = row_gradient_of(sums_x, sums_y, p.grad_of, p.args.grad_multiplier);
      const int64_t row = shard_row(r);
      float g[kLaneCols], v[kLaneCols], b[kLaneCols];
      gradient(r, g);
#pragma unroll
      for (int j = 0; j < kLaneCols; ++j) {
        b[j] = with_momentum ? to_float(l.m.e[j]) : 0.0f;
        v[j] = sgd_element(to_float(l.w.e[j]), g[j], dw, p.args, with_momentum ? &b[j] : nullptr);
      }
      if (with_momentum) store_floats(momentum + row * p.dim + column(), b);
      store(weight + row * p.dim + column(), v, (store.first_row + row) * p.dim + column());
    });
  }
};

template <typename W, typename State>
__global__ void __launch_bounds__(kThreads, 1)
    fused_sgd_rows_kernel(const __grid_constant__ CUtensorMap g_map,
                          const __grid_constant__ CUtensorMap x_map, W* weight, State* momentum,
                          Problem p, int halves) {
  Shared& s = shared_storage<Shared>();
  const int half = static_cast<int>(blockIdx.x) % halves;  // the CTA's rank in its cluster
  const int row0 = static_cast<int>(blockIdx.x) / halves * kRows;
  const int col0 = half * kCols;
  const int k_blocks = (p.batch + kSwizzleElements - 1) / kSwizzleElements;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      barrier_init(&s.full[i], 1);
      barrier_init(&s.empty[i], 2);  // each consumer warpgroup
    }
    barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce(s, &g_map, &x_map, row0, col0, k_blocks);
  } else {
    const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroup;
    const int t = static_cast<int>(threadIdx.x) % kWarpgroup;
    float acc[2][64];
    multiply(s, acc, warpgroup, t, k_blocks);
    // The tile goes over the ring: both warpgroups' products must have read it first.
    named_sync(1, kConsumers);
    stage(s, acc, warpgroup, t);
  }
  __syncthreads();
  const RowUpdate<W, State> u{s,
                              weight,
                              momentum,
                              p,
                              static_cast<int>(threadIdx.x) / 32,
                              static_cast<int>(threadIdx.x) % 32,
                              col0,
                              half,
                              halves,
                              row0};
  const bool sums = p.grad_of != RowGradient::kRow;
  if (sums) u.row_sums();
  // The halves' sums meet; with one half, each warp reads back only the sums of its own rows.
  if (sums && halves > 1)
    cluster_sync();
  else
    __syncwarp();
  u.update();
  // Neither CTA leaves while the other may still read its shared memory.
  if (sums && halves > 1) cluster_sync();
}

template <typename F>
void with_storage_type(ElementType type, F&& f) {
  if (type == ElementType::kBFloat16)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

}  // namespace

bool fused_sgd_rows_take(int64_t batch, int dim) {
  return batch > 0 && batch % 8 == 0 && batch < (int64_t{1} << 31) && dim > 0 && dim % 8 == 0 &&
         dim <= kFusedMaxDim;
}

cudaError_t fused_sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                           const void* logit_grad, const void* xt, int64_t batch, int dim,
                           const int64_t* index, int64_t begin, int64_t count, RowGradient grad_of,
                           SgdArgs args, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!fused_sgd_rows_take(batch, dim) || count > (int64_t{1} << 31) - kRows ||
      weight.type == ElementType::kFloat16 || momentum_type == ElementType::kFloat16)
    return cudaErrorInvalidValue;
  // Rows are read and written 8 elements at a time (16 or 32 bytes): a view into a shard that
  // starts elsewhere is refused here rather than faulting in the kernel.
  const auto element_bytes = [](ElementType type) {
    return type == ElementType::kBFloat16 ? 2 : 4;
  };
  if (!packs_fit(dim, 8, weight.data, element_bytes(weight.type)) ||
      !packs_fit(dim, 8, momentum, element_bytes(momentum_type)))
    return cudaErrorMisalignedAddress;
  CUtensorMap g_map, x_map;
  cudaError_t rc = matrix_map(&g_map, logit_grad, count, static_cast<int>(batch), kRows);
  if (rc == cudaSuccess) rc = matrix_map(&x_map, xt, dim, static_cast<int>(batch), kBlockCols);
  if (rc != cudaSuccess) return rc;
  const Problem p{count, static_cast<int>(batch),
                  dim,   index,
                  begin, grad_of,
                  args,  WeightStore{weight.first_row, weight.rounding_seed}};
  const int halves = dim > kCols ? 2 : 1;
  const unsigned tiles = static_cast<unsigned>((count + kRows - 1) / kRows);
  rc = cudaSuccess;
  with_storage_type(weight.type, [&](auto* w_tag) {
    using W = std::remove_pointer_t<decltype(w_tag)>;
    with_storage_type(momentum_type, [&](auto* s_tag) {
      using State = std::remove_pointer_t<decltype(s_tag)>;
      const auto kernel = fused_sgd_rows_kernel<W, State>;
      const size_t shared = sizeof(Shared) + kSwizzleAtomBytes;
      rc = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(shared));
      if (rc != cudaSuccess) return;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(tiles * halves);
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = shared;
      config.stream = stream;
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(halves);
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      config.attrs = &cluster;
      config.numAttrs = 1;
      rc = cudaLaunchKernelEx(&config, kernel, g_map, x_map, static_cast<W*>(weight.data),
                              static_cast<State*>(momentum), p, halves);
    });
  });
  if (rc != cudaSuccess) return rc;
  return cudaGetLastError();
}

}  // namespace myriad::cuda
