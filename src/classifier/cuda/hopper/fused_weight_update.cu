// SGD with the rows' gradient formed on chip (fused_weight_update.h), in a persistent kernel that
// streams the weights as an update kernel would. A CTA owns 128 rows and 256 columns of a tile
// of the gradient, g[rows, cols] = logit_grad[rows, :] x[:, cols], summed over the batch with
// wgmma from a TMA ring, and walks its tiles in turn. Four consumer warpgroups each own 64 rows
// and 128 columns: the update's arithmetic, not the products, sets the pace, and it needs four
// warps per scheduler to hide its latencies (two, with 256 columns each, issued 40% of the time).
// - a producer warp keeps the ring of logit_grad and x blocks full, across tiles;
// - the other three producer warps copy the next tile's weights into shared memory (cp.async,
//   so that Partial FC's gathered rows come as cheaply as contiguous ones) while the products
//   run;
// - each consumer thread starts copying its first momentum into shared memory before the
//   products, and each later part's before it computes the present one (copies hold no
//   registers; loads held ahead spilled the accumulators);
// - the consumers update from their accumulators: w.g and |w|^2 from the staged weights (the two
//   warpgroups that share rows add their columns' sums through shared memory), then the new
//   weights and momentum stored straight from registers, 16 bytes at a time.
// One tile's update thus overlaps the copies of the next. Measured against cuBLAS's GEMM and
// sgd_rows in docs/classifier.md.
//
// A row's gradient with respect to the stored row needs w.g and |w|^2 over the whole row. Where
// D > 256 the two halves of a row lie in two CTAs of a cluster that walk the same tiles. Each
// sends its halves' sums into the other's shared memory and arrives on the other's barrier; both
// add them in one fixed order, so that --deterministic reruns stay bit for bit.
//
// bf16 weights only: float32 rows of 256 columns would take 128 KB of shared memory, which leaves
// too little for the ring.

#include <cuda.h>
#include <cuda_bf16.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "../row_update.cuh"
#include "fused_weight_update.h"
#include "hopper.cuh"

namespace myriad::cuda {

namespace {

using namespace hopper;

constexpr int kRows = 128;       // gradient rows per tile
constexpr int kCols = 256;       // and columns: two wgmma N blocks
constexpr int kBlockCols = 128;  // columns of one wgmma
constexpr int kHalfRows = 64;    // rows per consumer warpgroup (wgmma's M)
constexpr int kWarpgroup = 128;
constexpr int kConsumerGroups = 4;  // (rows / kHalfRows) x (columns / kBlockCols)
constexpr int kConsumers = kConsumerGroups * kWarpgroup;
constexpr int kThreads = kConsumers + kWarpgroup;
// Registers per thread: the launch gives 65536 / kThreads, rounded down to 8 (96), which the
// producers hand to the consumers.
constexpr int kProducerRegisters = 32;
constexpr int kConsumerRegisters = 112;
static_assert(kProducerRegisters * kWarpgroup + kConsumerRegisters * kConsumers <=
                  65536 / kThreads / 8 * 8 * kThreads,
              "the warpgroups' registers exceed the launch's");
constexpr int kStages = 2;
constexpr int kChunks = kCols * 2 / 16;  // 16-byte chunks of a tile row of bf16 weights: 32
constexpr int kMomentumSlots = 4;        // 16-byte slots per consumer thread
constexpr int kOperandWarp = kConsumers / 32;
constexpr int kWeightWarps = 3;  // the producer warpgroup's warps after the operand warp

struct Shared {
  // Stage: the K block of 64 samples of the tile's logit_grad rows and of its columns of x.
  __nv_bfloat16 a[kStages][kRows * kSwizzleElements];
  __nv_bfloat16 b[kStages][2][kBlockCols * kSwizzleElements];
  // The tile's weights, chunk c of row r at [r][c ^ (r % 8)]: the eight rows that a warp reads
  // at once then lie in different banks.
  uint4 w[kRows][kChunks];
  // The consumers' momentum, each thread's own slots: [slot][thread], so that a warp's reads of a
  // slot are contiguous. Each thread copies in the next part of its update's momentum while it
  // computes the present one; copies hold no registers, unlike loads.
  uint4 m[kMomentumSlots][kConsumers];
  // Per row, by the tile's parity: each 128-column block's (w.g, |w|^2), and the other half's.
  float2 block_sums[2][kCols / kBlockCols][kRows];
  float2 sums[2][kRows];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  uint64_t w_full, w_empty;
  uint64_t sums_full[2][kRows / kHalfRows];  // [tile parity][the warpgroups' rows]
};
constexpr uint32_t kStageBytes = (kRows + 2 * kBlockCols) * kSwizzleElements * 2;

struct Problem {
  int64_t count;  // rows
  int batch, dim, halves, tiles;
  const int64_t* index;
  int64_t begin;
  RowGradient grad_of;
  SgdArgs args;
  WeightStore store;

  __device__ int64_t shard_row(int64_t r) const {
    return index != nullptr ? index[begin + r] : begin + r;
  }
  __device__ int k_blocks() const { return (batch + kSwizzleElements - 1) / kSwizzleElements; }
};

// This CTA's place: its cluster walks tiles cluster, cluster + clusters, ...; it owns columns
// [col0, col0 + kCols) of each.
struct Walk {
  int half, cluster, clusters, col0;
  __device__ explicit Walk(const Problem& p)
      : half(static_cast<int>(blockIdx.x) % p.halves),
        cluster(static_cast<int>(blockIdx.x) / p.halves),
        clusters(static_cast<int>(gridDim.x) / p.halves),
        col0(half * kCols) {}
  template <class Body>
  __device__ void tiles(const Problem& p, Body&& body) const {
    int n = 0;
    for (int tile = cluster; tile < p.tiles; tile += clusters) body(n++, tile * kRows);
  }
};

// The operand producer's one thread: every tile's K blocks through the ring.
__device__ void produce_operands(Shared& s, const CUtensorMap* g_map, const CUtensorMap* x_map,
                                 const Problem& p, const Walk& walk) {
  const int k_blocks = p.k_blocks();
  int issued = 0;
  walk.tiles(p, [&](int, int row0) {
    for (int kb = 0; kb < k_blocks; ++kb, ++issued) {
      const int stage = issued % kStages, round = issued / kStages;
      if (round > 0) barrier_wait(&s.empty[stage], (round - 1) & 1);
      barrier_arrive_expect(&s.full[stage], kStageBytes);
      tma_load_2d(s.a[stage], g_map, kb * kSwizzleElements, row0, &s.full[stage]);
      for (int q = 0; q < 2; ++q)
        tma_load_2d(s.b[stage][q], x_map, kb * kSwizzleElements, walk.col0 + q * kBlockCols,
                    &s.full[stage]);
    }
  });
}

// A weight producer warp: rows first, first + kWeightWarps, ... of each tile, lane l copying
// chunk l of each, once the consumers are done with the previous tile's.
__device__ void produce_weights(Shared& s, const __nv_bfloat16* weight, const Problem& p,
                                const Walk& walk, int first, int lane) {
  const int col = walk.col0 + lane * 8;
  walk.tiles(p, [&](int n, int row0) {
    if (n > 0) barrier_wait(&s.w_empty, (n - 1) & 1);
    const int rows = static_cast<int>(p.count - row0 < kRows ? p.count - row0 : kRows);
    if (col < p.dim) {
      const __nv_bfloat16* source = weight + col;
      for (int r = first; r < rows; r += kWeightWarps)
        cp_async_16(&s.w[r][lane ^ (r % 8)], source + p.shard_row(row0 + r) * p.dim);
    }
    cp_async_arrive(&s.w_full);
  });
}

// A consumer warpgroup's place in the tile: rows [64 rows, + 64), columns [128 block, + 128).
struct Place {
  int rows, block, t;
  __device__ explicit Place(int warpgroup, int thread)
      : rows(warpgroup % 2), block(warpgroup / 2), t(thread) {}
  __device__ int warpgroup() const { return block * 2 + rows; }
  __device__ int thread() const { return warpgroup() * kWarpgroup + t; }
};

// A consumer warpgroup's 64 rows x 128 columns of a tile's gradient; `consumed` counts the K
// blocks that earlier tiles took from the ring.
__device__ void multiply(Shared& s, float (&acc)[1][64], const Place& at, int k_blocks,
                         int& consumed) {
  int previous = -1;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = (consumed + kb) % kStages;
    barrier_wait(&s.full[stage], ((consumed + kb) / kStages) & 1);
    const uint64_t a =
        descriptor_k_major_sw128(&s.a[stage][at.rows * kHalfRows * kSwizzleElements]);
    const uint64_t b = descriptor_k_major_sw128(s.b[stage][at.block]);
    wgmma_k_block(
        acc, [&](int) { return a; }, [&](int) { return b; }, kb > 0);
    if (previous >= 0 && at.t == 0) barrier_arrive(&s.empty[previous]);
    previous = stage;
  }
  wgmma_wait<0>();
  fence_registers(acc);
  if (at.t == 0) barrier_arrive(&s.empty[previous]);
  consumed += k_blocks;
}

// A consumer thread's part of a tile's update. xt's rows come in fused_sgd_rows_column's order,
// so that register i of acc, which holds the warpgroup's row row((i / 2) % 2) and accumulator
// column fragment_col(t, i), holds the block's column 32 m + 8 (t % 4) + 2 a + i % 2 with
// m = i / 16, a = (i / 4) % 4: each thread holds 8 neighbouring columns of its rows, which it
// reads and writes as one access (moving pairs of columns took twice the time). Nesterov's
// momentum is a constant of the kernel: the update's arithmetic sets its pace.
template <typename State, bool kNesterov>
struct Epilogue {
  Shared& s;
  const Problem& p;
  const Walk& walk;
  __nv_bfloat16* weight;
  State* momentum;
  Place place;
  int row0;

  static constexpr int kPacks = 4;  // packs of 8 columns per row and 128-column block

  __device__ int row(int j) const { return place.rows * kHalfRows + fragment_row(place.t, 2 * j); }
  // Pack m: its first column among the CTA's, and its chunk of the staged row.
  __device__ int col(int m) const { return place.block * kBlockCols + 32 * m + 8 * (place.t % 4); }
  __device__ bool valid(int m) const { return walk.col0 + col(m) < p.dim; }
  __device__ void staged(int r, int m, float (&w)[8]) const {
    to_floats(*reinterpret_cast<const Pack<__nv_bfloat16, 8>*>(&s.w[r][(col(m) / 8) ^ (r % 8)]), w);
  }
  // The gradient of pack m of row j, in column order.
  __device__ static void gradient(const float (&acc)[1][64], int m, int j, float (&g)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = acc[0][16 * m + 4 * (e / 2) + 2 * j + e % 2];
  }

  // This thread's rows' (w.g, |w|^2) over the warpgroup's columns, summed over the four threads
  // that share each row.
  __device__ void block_sums(const float (&acc)[1][64], float2 (&sums)[2]) const {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int m = 0; m < kPacks; ++m) {
        if (!valid(m)) continue;
        float w[8], g[8];
        staged(row(j), m, w);
        gradient(acc, m, j, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          sums[j].x = fmaf(w[e], g[e], sums[j].x);
          sums[j].y = fmaf(w[e], w[e], sums[j].y);
        }
      }
#pragma unroll
    for (int j = 0; j < 2; ++j)
      for (int offset = 1; offset < 4; offset <<= 1) {
        sums[j].x += __shfl_xor_sync(0xffffffff, sums[j].x, offset);
        sums[j].y += __shfl_xor_sync(0xffffffff, sums[j].y, offset);
      }
  }

  // The sums over the CTA's columns: the two warpgroups of these rows hand each other their
  // blocks' through shared memory (a slot per tile parity: a warpgroup reaches the next tile's
  // meeting only after both left this one) and add them.
  __device__ void cta_sums(int n, float2 (&sums)[2]) const {
    const int slot = n % 2;
    if (place.t % 4 == 0)
      for (int j = 0; j < 2; ++j) s.block_sums[slot][place.block][row(j)] = sums[j];
    named_sync(1 + place.rows, 2 * kWarpgroup);
    for (int j = 0; j < 2; ++j) {
      const float2 theirs = s.block_sums[slot][1 - place.block][row(j)];
      sums[j] = make_float2(sums[j].x + theirs.x, sums[j].y + theirs.y);
    }
  }

  // The sums over whole rows: with two halves, the first block's warpgroup of each CTA hands the
  // CTA's to the other CTA, and both warpgroups of these rows add half 0's and half 1's in that
  // order.
  __device__ void whole_sums(int n, float2 (&sums)[2]) const {
    if (p.halves == 1) return;
    const int slot = n % 2, other = 1 - walk.half;
    if (place.block == 0) {
      if (place.t % 4 == 0)
        for (int j = 0; j < 2; ++j) store_remote(&s.sums[slot][row(j)], other, sums[j]);
      arrive_remote(&s.sums_full[slot][place.rows], other);
    }
    barrier_wait_cluster(&s.sums_full[slot][place.rows], (n / 2) & 1);
    for (int j = 0; j < 2; ++j) {
      const float2 theirs = s.sums[slot][row(j)];
      const float2 first = walk.half == 0 ? sums[j] : theirs;
      const float2 second = walk.half == 0 ? theirs : sums[j];
      sums[j] = make_float2(first.x + second.x, first.y + second.y);
    }
  }

  // A part of the update is packs 2 (part % 2) and + 1 of row j = part / 2: 2 slots of momentum
  // (bf16) or 4 (float32). bf16 momentum takes two buffers of slots, float32 one.
  static constexpr int kPartPacks = 2;
  static constexpr int kPackSlots = sizeof(State) / 2;
  static constexpr int kPartSlots = kPartPacks * kPackSlots;
  static constexpr int kBuffers = kMomentumSlots / kPartSlots;
  static constexpr int kParts = 2 * kPacks / kPartPacks;
  static_assert(kBuffers >= 1, "a part's momentum exceeds the slots");

  // Starts copying `part`'s momentum into its buffer, as one group of copies.
  __device__ void fetch_momentum(int part, const int64_t (&at)[2]) const {
    const int j = part / 2, first = (part % kBuffers) * kPartSlots;
    if (momentum != nullptr && at[j] >= 0) {
#pragma unroll
      for (int k = 0; k < kPartPacks; ++k) {
        const int m = (part % 2) * kPartPacks + k;
        if (!valid(m)) continue;
        const auto* from = reinterpret_cast<const uint4*>(momentum + at[j] + col(m));
#pragma unroll
        for (int q = 0; q < kPackSlots; ++q)
          cp_async_16(&s.m[first + k * kPackSlots + q][place.thread()], from + q);
      }
    }
    cp_async_commit();
  }
  __device__ Pack<State, 8> fetched(int part, int k) const {
    Pack<State, 8> pack;
    auto* words = reinterpret_cast<uint4*>(&pack);
    const int first = (part % kBuffers) * kPartSlots + k * kPackSlots;
#pragma unroll
    for (int q = 0; q < kPackSlots; ++q) words[q] = s.m[first + q][place.thread()];
    return pack;
  }
  // Waits for `part`'s copies: the copies of the parts after it that are already under way may
  // still land.
  __device__ static void wait_momentum(int part) {
    if (kBuffers > 1 && part + 1 < kParts)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
  }

  __device__ void update_part(int part, const float (&acc)[1][64], const RowGradientOf& dw,
                              const int64_t (&at)[2]) const {
    const int j = part / 2;
    if (at[j] < 0) return;
    const bool with_momentum = momentum != nullptr;
    // Stochastic rounding draws the bits of each element's index in the whole classifier.
    const int64_t first_element = p.store.first_row * p.dim;
#pragma unroll
    for (int k = 0; k < kPartPacks; ++k) {
      const int m = (part % 2) * kPartPacks + k;
      if (!valid(m)) continue;
      float w[8], g[8], state[8];
      staged(row(j), m, w);
      gradient(acc, m, j, g);
      if (with_momentum) to_floats(fetched(part, k), state);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        w[e] = sgd_element<kNesterov>(w[e], g[e], dw, p.args, with_momentum ? &state[e] : nullptr);
      const int64_t at_pack = at[j] + col(m);
      if (with_momentum) store_floats(momentum + at_pack, state);
      p.store.even_pack(weight + at_pack, w, first_element + at_pack);
    }
  }

  // Each of the thread's rows' first element of this CTA's columns in the shard, or -1.
  __device__ void rows_at(int64_t (&at)[2]) const {
    for (int j = 0; j < 2; ++j) {
      const int64_t r = int64_t{row0} + row(j);
      at[j] = r < p.count ? p.shard_row(r) * p.dim + walk.col0 : -1;
    }
  }
  // Before the products: the first parts' momentum starts landing.
  __device__ void prefetch(const int64_t (&at)[2]) const {
    for (int part = 0; part < kBuffers; ++part) fetch_momentum(part, at);
  }

  __device__ void update(int n, const float (&acc)[1][64], const int64_t (&at)[2]) const {
    float2 sums[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
    if (p.grad_of != RowGradient::kRow) {
      block_sums(acc, sums);
      cta_sums(n, sums);
      whole_sums(n, sums);
    }
    RowGradientOf dw[2];
    for (int j = 0; j < 2; ++j)
      dw[j] = row_gradient_of(sums[j].x, sums[j].y, p.grad_of, p.args.grad_multiplier);
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      wait_momentum(part);
      update_part(part, acc, dw[part / 2], at);
      // The part's stores used what it read of its buffer, so the copies may overwrite it.
      if (part + kBuffers < kParts) fetch_momentum(part + kBuffers, at);
    }
  }
};

template <typename State, bool kNesterov>
__global__ void __launch_bounds__(kThreads, 1)
    fused_sgd_rows_kernel(const __grid_constant__ CUtensorMap g_map,
                          const __grid_constant__ CUtensorMap x_map, __nv_bfloat16* weight,
                          State* momentum, Problem p) {
  Shared& s = shared_storage<Shared>();
  const Walk walk(p);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      barrier_init(&s.full[i], 1);
      barrier_init(&s.empty[i], kConsumerGroups);
    }
    barrier_init(&s.w_full, 32 * kWeightWarps);  // each lane of the weight producers
    barrier_init(&s.w_empty, kConsumers);
    // Each thread of the other CTA's warpgroup of the same rows and first block.
    for (int slot = 0; slot < 2; ++slot)
      for (int q = 0; q < kRows / kHalfRows; ++q) barrier_init(&s.sums_full[slot][q], kWarpgroup);
    barrier_init_fence();
  }
  // The other CTA of the cluster arrives on these barriers: both must have initialised them.
  if (p.halves > 1)
    cluster_sync();
  else
    __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x >= kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == kOperandWarp && threadIdx.x % 32 == 0) produce_operands(s, &g_map, &x_map, p, walk);
    if (warp > kOperandWarp && warp <= kOperandWarp + kWeightWarps)
      produce_weights(s, weight, p, walk, warp - kOperandWarp - 1,
                      static_cast<int>(threadIdx.x) % 32);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    const Place place(static_cast<int>(threadIdx.x) / kWarpgroup,
                      static_cast<int>(threadIdx.x) % kWarpgroup);
    int consumed = 0;
    walk.tiles(p, [&](int n, int row0) {
      const Epilogue<State, kNesterov> e{s, p, walk, weight, momentum, place, row0};
      int64_t at[2];
      e.rows_at(at);
      e.prefetch(at);
      float acc[1][64];
      multiply(s, acc, place, p.k_blocks(), consumed);
      barrier_wait(&s.w_full, n & 1);
      e.update(n, acc, at);
      barrier_arrive(&s.w_empty);
    });
  }
  // Neither CTA leaves while the other may still write to its shared memory.
  if (p.halves > 1) cluster_sync();
}

template <typename State, bool kNesterov>
struct Launch {
  // The kernel's shared memory and the clusters that fit the device at once, asked once per
  // device: the grid is that many, each walking its share of the tiles.
  static cudaError_t clusters(int halves, int* out) {
    constexpr int kMaxDevices = 64;
    static std::array<std::atomic<int>, 2 * kMaxDevices> found{};
    int device = 0;
    cudaError_t rc = cudaGetDevice(&device);
    if (rc != cudaSuccess) return rc;
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    std::atomic<int>& known = found[2 * device + halves - 1];
    int count = known.load(std::memory_order_relaxed);
    if (count == 0) {
      rc = cudaFuncSetAttribute(fused_sgd_rows_kernel<State, kNesterov>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes());
      if (rc != cudaSuccess) return rc;
      cudaLaunchConfig_t config = configuration(1, halves, nullptr);
      cudaLaunchAttribute cluster = cluster_attribute(halves);
      config.attrs = &cluster;
      config.numAttrs = 1;
      rc = cudaOccupancyMaxActiveClusters(&count, fused_sgd_rows_kernel<State, kNesterov>, &config);
      if (rc != cudaSuccess) return rc;
      if (count == 0) return cudaErrorInvalidConfiguration;
      known.store(count, std::memory_order_relaxed);
    }
    *out = count;
    return cudaSuccess;
  }
  static int shared_bytes() { return static_cast<int>(sizeof(Shared) + kSwizzleAtomBytes); }
  static cudaLaunchConfig_t configuration(int clusters, int halves, cudaStream_t stream) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(clusters * halves));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(shared_bytes());
    config.stream = stream;
    return config;
  }
  static cudaLaunchAttribute cluster_attribute(int halves) {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(halves);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    return cluster;
  }
  static cudaError_t run(const CUtensorMap& g_map, const CUtensorMap& x_map, __nv_bfloat16* weight,
                         void* momentum, const Problem& p, cudaStream_t stream) {
    int fit = 0;
    cudaError_t rc = clusters(p.halves, &fit);
    if (rc != cudaSuccess) return rc;
    cudaLaunchConfig_t config = configuration(fit < p.tiles ? fit : p.tiles, p.halves, stream);
    cudaLaunchAttribute cluster = cluster_attribute(p.halves);
    config.attrs = &cluster;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, fused_sgd_rows_kernel<State, kNesterov>, g_map, x_map,
                              weight, static_cast<State*>(momentum), p);
  }
};

}  // namespace

bool fused_sgd_rows_take(int64_t batch, int dim, ElementType weight_type) {
  return fused_update_batch_fits(batch) && fused_dim_fits(dim) &&
         weight_type == ElementType::kBFloat16;
}

cudaError_t fused_sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                           const void* logit_grad, const void* xt, int64_t batch, int dim,
                           const int64_t* index, int64_t begin, int64_t count, RowGradient grad_of,
                           SgdArgs args, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!fused_sgd_rows_take(batch, dim, weight.type) || count > (int64_t{1} << 31) - kRows ||
      momentum_type == ElementType::kFloat16)
    return cudaErrorInvalidValue;
  // Weights and momentum are copied 8 elements at a time: a view into a shard that starts
  // elsewhere is refused here rather than faulting in the kernel.
  if (!packs_fit(dim, 8, weight.data, 2) ||
      !packs_fit(dim, 8, momentum, momentum_type == ElementType::kBFloat16 ? 2 : 4))
    return cudaErrorMisalignedAddress;
  CUtensorMap g_map, x_map;
  cudaError_t rc = matrix_map(&g_map, logit_grad, count, static_cast<int>(batch), kRows);
  if (rc == cudaSuccess)
    rc = matrix_map(&x_map, xt, fused_sgd_rows_xt_rows(dim), static_cast<int>(batch), kBlockCols);
  if (rc != cudaSuccess) return rc;
  const Problem p{count,
                  static_cast<int>(batch),
                  dim,
                  dim > kCols ? 2 : 1,
                  static_cast<int>((count + kRows - 1) / kRows),
                  index,
                  begin,
                  grad_of,
                  args,
                  WeightStore{weight.first_row, weight.rounding_seed}};
  auto* w = static_cast<__nv_bfloat16*>(weight.data);
  const auto run = [&](auto launch) {
    return decltype(launch)::run(g_map, x_map, w, momentum, p, stream);
  };
  if (momentum_type == ElementType::kBFloat16)
    rc = args.nesterov ? run(Launch<__nv_bfloat16, true>{}) : run(Launch<__nv_bfloat16, false>{});
  else
    rc = args.nesterov ? run(Launch<float, true>{}) : run(Launch<float, false>{});
  if (rc != cudaSuccess) return rc;
  return cudaGetLastError();
}

}  // namespace myriad::cuda
