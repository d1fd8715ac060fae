// Batch norm (+ PReLU, + a residual): the statistics pass, then one pass forward; two passes
// backward (batch_norm_prelu_kernels.h).
//
// Every kernel runs on blocks of threads (tx, ty): tx packs of channels side by side, ty rows, so
// that a warp reads consecutive bytes of whole rows. A thread keeps its channels' constants in
// registers and walks rows ty * gridDim.y apart, kRowsAtOnce at a time so that their loads are in
// flight together (the constants take registers, so few threads fit on a multiprocessor, and each
// must keep more bytes in flight to reach the memory's rate). A pack is V elements of one row, 16
// bytes, one load or store, which the memory system serves far better than narrower ones; that
// needs channels % V == 0 and 16-byte aligned data (every IResNet width), otherwise V = 1.
//
// The reductions run one wave of the blocks that fit on the GPU at once, each writing one row of
// partial sums; a second wave would start its loads only as the first one's blocks drain. So does
// a forward pass that also sums its output for the next batch norm.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "batch_norm_prelu_kernels.h"
#include "myriad/util/cuda_elements.cuh"

namespace myriad::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsAtOnce = 2;

// One channel's constants: x̂ = x a + b (a = invstd, b = -mean invstd), z = x̂ gamma + beta,
// y = z > 0 ? z : alpha z.
struct Channel {
  float a, b, gamma, beta, alpha;
};

__device__ inline Channel channel(const BatchNormPReLUParams& p, int64_t c) {
  const float invstd = p.invstd[c];
  return {invstd, -p.mean[c] * invstd, p.gamma[c], p.beta[c],
          p.alpha != nullptr ? p.alpha[c * p.alpha_stride] : 1.0f};
}

// One element's x̂ and z from x, and dz, the gradient of z, from dy.
struct Backward {
  float xhat, z, dz;
};

__device__ inline Backward backward_of(const Channel& ch, float x, float dy) {
  const float xhat = x * ch.a + ch.b;
  const float z = xhat * ch.gamma + ch.beta;
  return {xhat, z, z > 0.0f ? dy : ch.alpha * dy};
}

// This thread's pack of channels and first row, and the distance between its rows.
struct Lane {
  int64_t pack, packs_per_row, row, row_step;
};

template <int V>
__device__ inline Lane lane(int64_t channels) {
  return {blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, channels / V,
          blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y,
          static_cast<int64_t>(gridDim.y) * blockDim.y};
}

// This thread's rows (the shared row walk, kRowsAtOnce at a time), each named by the index of the
// thread's pack in the whole tensor.
template <int kAtOnce = kRowsAtOnce, class Read, class Use>
__device__ inline void for_each_lane_row(const Lane& l, int64_t rows, Read&& read, Use&& use) {
  const auto at = [&](int64_t r) { return r * l.packs_per_row + l.pack; };
  for_each_row<kAtOnce>(
      l.row, rows, l.row_step, [&](int64_t r) { return read(at(r)); },
      [&](int64_t r, const auto& data) { use(at(r), data); });
}

// Two tensors at one pack: x and dy, or x and the residual.
template <typename T, int V>
struct TwoPacks {
  Pack<T, V> x, other;
};

// The block's sums over its rows: each thread's J x V sums go through shared memory (J V floats
// per thread, the launch's dynamic size), are added over ty in a fixed tree, and the block's row of
// partials [J, channels] is written at partials + blockIdx.y J channels.
template <int J, int V>
__device__ inline void write_block_sums(float (&s)[J][V], const Lane& l, int64_t channels,
                                        float* __restrict__ partials) {
  extern __shared__ float shared[];  // [ty][tx][J V]
  float* mine = shared + (threadIdx.y * blockDim.x + threadIdx.x) * J * V;
#pragma unroll
  for (int j = 0; j < J; ++j) {
#pragma unroll
    for (int k = 0; k < V; ++k) mine[j * V + k] = s[j][k];
  }
  __syncthreads();
  // blockDim.y is a power of two.
  for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
      const float* other = mine + half * blockDim.x * J * V;
      for (int j = 0; j < J * V; ++j) mine[j] += other[j];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && l.pack < l.packs_per_row) {
    float* out = partials + blockIdx.y * J * channels;
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int k = 0; k < V; ++k) out[j * channels + l.pack * V + k] = mine[j * V + k];
    }
  }
}

// Σ_b partials[b width + column[j]] over the row blocks for J columns, by the whole block (kThreads
// threads): each thread adds every kThreads-th block in order, the lanes' sums meet in a fixed
// butterfly, and the warps' in order through shared memory; the same bits at every run. Thread 0
// gets the sums. A warp per column kept 4 loads in flight a lane over 17-33 blocks, bound by their
// latency; here a thread has 2-4 blocks, all its loads issued together.
template <int J>
__device__ inline void sum_columns(const float* __restrict__ partials, int64_t blocks,
                                   int64_t width, const int64_t (&column)[J], float (&out)[J]) {
  __shared__ float warps[kThreads / 32][J];
  float s[J] = {};
#pragma unroll 4
  for (int64_t b = threadIdx.x; b < blocks; b += kThreads) {
#pragma unroll
    for (int j = 0; j < J; ++j) s[j] += partials[b * width + column[j]];
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    for (int offset = 16; offset > 0; offset /= 2)
      s[j] += __shfl_xor_sync(0xffffffffu, s[j], offset);
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32][j] = s[j];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    out[j] = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) out[j] += warps[w][j];
  }
}

// The shift of the thread's pack of channels, `first`, stored once: by the threads of row 0.
template <int V>
__device__ inline void store_shift(const Lane& l, const float (&first)[V],
                                   float* __restrict__ shift) {
  if (blockIdx.y != 0 || threadIdx.y != 0) return;
#pragma unroll
  for (int k = 0; k < V; ++k) shift[l.pack * V + k] = first[k];
}

// Per channel, sums of d = x - shift and of d², the shift being row 0's value (written to `shift`
// for the statistics): the same for every thread, so that the sums of all blocks add up, and near
// the mean, so that the variance's difference of squares loses little. Plain sums need no division
// per element (Welford's does).
template <typename T, int V>
__global__ void batch_norm_statistics_kernel(const T* __restrict__ x, int64_t rows,
                                             int64_t channels, float* __restrict__ partials,
                                             float* __restrict__ shift_out) {
  const Lane l = lane<V>(channels);
  float s[2][V] = {};
  if (l.pack < l.packs_per_row) {
    const Pack<T, V> first = load_pack<V>(x + l.pack * V);
    float shift[V];
#pragma unroll
    for (int k = 0; k < V; ++k) shift[k] = to_float(first.e[k]);
    store_shift(l, shift, shift_out);
    for_each_lane_row(
        l, rows, [&](int64_t i) { return load_pack<V>(x + i * V); },
        [&](int64_t, const Pack<T, V>& xs) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float d = to_float(xs.e[k]) - shift[k];
            s[0][k] += d;
            s[1][k] += d * d;
          }
        });
  }
  write_block_sums(s, l, channels, partials);
}

// Channel c's statistics from its mean and its variance before clamping, and the running
// statistics updated as LibTorch's batch norm updates them (with the unbiased variance); channel
// 0 counts the batch.
__device__ inline void store_statistics(int64_t c, float m, float diff, float n, float eps,
                                        float momentum, float* __restrict__ mean,
                                        float* __restrict__ invstd,
                                        const RunningStatistics& running) {
  // Rounding can take the difference below 0; NaN stays NaN (fmaxf would hide it in running_var).
  const float var = diff < 0.0f ? 0.0f : diff;
  mean[c] = m;
  invstd[c] = rsqrtf(var + eps);
  if (running.mean != nullptr) {
    running.mean[c] = (1.0f - momentum) * running.mean[c] + momentum * m;
    running.var[c] = (1.0f - momentum) * running.var[c] + momentum * var * n / (n - 1.0f);
  }
  if (running.batches != nullptr && c == 0) *running.batches += 1;
}

// The statistics from the blocks' sums of x - shift (shift null: 0), a block per channel; the
// difference of squares in double precision.
__global__ void batch_norm_statistics_finish_kernel(const float* __restrict__ partials,
                                                    const float* __restrict__ shift, int64_t blocks,
                                                    int64_t rows, int64_t channels, float eps,
                                                    float momentum, float* __restrict__ mean,
                                                    float* __restrict__ invstd,
                                                    RunningStatistics running) {
  const int64_t c = blockIdx.x;
  float sums[2];
  sum_columns<2>(partials, blocks, 2 * channels, {c, channels + c}, sums);
  if (threadIdx.x != 0) return;
  const double n = static_cast<double>(rows);
  const double offset = sums[0] / n;
  const double m = (shift != nullptr ? shift[c] : 0.0) + offset;
  store_statistics(c, static_cast<float>(m), static_cast<float>(sums[1] / n - offset * offset),
                   static_cast<float>(n), eps, momentum, mean, invstd, running);
}

// y = PReLU(batch norm(x)) (+ residual): the residual's add costs no pass of its own. Where kSums,
// also the sums of y as stored, less y's first row (written to `shift`), over the block's rows into
// `partials`: the statistics of the batch norm that reads y next, without a pass of its own.
template <typename T, int V, bool kResidual, bool kSums>
__global__ void batch_norm_prelu_forward_kernel(const T* __restrict__ x,
                                                const T* __restrict__ residual, T* __restrict__ y,
                                                int64_t rows, int64_t channels,
                                                BatchNormPReLUParams p,
                                                float* __restrict__ partials,
                                                float* __restrict__ shift) {
  const Lane l = lane<V>(channels);
  const bool mine = l.pack < l.packs_per_row;
  // Summing, every thread takes part in the block's tree.
  if (!kSums && !mine) return;
  float s[2][V] = {};
  if (mine) {
    Channel ch[V];
#pragma unroll
    for (int k = 0; k < V; ++k) ch[k] = channel(p, l.pack * V + k);
    const auto read = [&](int64_t i) {
      TwoPacks<T, V> in{load_pack<V>(x + i * V), {}};
      if constexpr (kResidual) in.other = load_pack<V>(residual + i * V);
      return in;
    };
    const auto output = [&](const TwoPacks<T, V>& in) {
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float z = (to_float(in.x.e[k]) * ch[k].a + ch[k].b) * ch[k].gamma + ch[k].beta;
        float v = z > 0.0f ? z : ch[k].alpha * z;
        if constexpr (kResidual) v += to_float(in.other.e[k]);
        out.e[k] = from_float<T>(v);
      }
      return out;
    };
    [[maybe_unused]] float first[V] = {};
    if constexpr (kSums) {
      const Pack<T, V> y0 = output(read(l.pack));
#pragma unroll
      for (int k = 0; k < V; ++k) first[k] = to_float(y0.e[k]);
      store_shift(l, first, shift);
    }
    for_each_lane_row(l, rows, read, [&](int64_t i, const TwoPacks<T, V>& in) {
      const Pack<T, V> out = output(in);
      store_pack<V>(y + i * V, out);
      if constexpr (kSums) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = to_float(out.e[k]) - first[k];
          s[0][k] += d;
          s[1][k] += d * d;
        }
      }
    });
  }
  if constexpr (kSums) write_block_sums(s, l, channels, partials);
}

template <typename T, int V>
__global__ void batch_norm_prelu_backward_reduce_kernel(const T* __restrict__ x,
                                                        const T* __restrict__ dy, int64_t rows,
                                                        int64_t channels, BatchNormPReLUParams p,
                                                        float* __restrict__ partials) {
  const Lane l = lane<V>(channels);
  float s[3][V] = {};
  if (l.pack < l.packs_per_row) {
    Channel ch[V];
#pragma unroll
    for (int k = 0; k < V; ++k) ch[k] = channel(p, l.pack * V + k);
    for_each_lane_row(
        l, rows,
        [&](int64_t i) {
          return TwoPacks<T, V>{load_pack<V>(x + i * V), load_pack<V>(dy + i * V)};
        },
        [&](int64_t, const TwoPacks<T, V>& in) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float g = to_float(in.other.e[k]);
            const Backward b = backward_of(ch[k], to_float(in.x.e[k]), g);
            s[0][k] += b.dz;
            s[1][k] += b.dz * b.xhat;
            s[2][k] += b.z > 0.0f ? 0.0f : g * b.z;
          }
        });
  }
  write_block_sums(s, l, channels, partials);
}

// The backward sums' J columns of each channel over the row blocks, a block per channel: three
// (batch_norm_prelu_backward_reduce), or two where a fold formed them (no slope's).
template <int J>
__global__ void batch_norm_backward_sums_kernel(const float* __restrict__ partials, int64_t blocks,
                                                int64_t channels, float* __restrict__ sums) {
  const int64_t c = blockIdx.x;
  int64_t column[J];
#pragma unroll
  for (int j = 0; j < J; ++j) column[j] = j * channels + c;
  float s[J];
  sum_columns<J>(partials, blocks, J * channels, column, s);
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int j = 0; j < J; ++j) sums[j * channels + c] = s[j];
}

// x, dy, the gradient that x's other branch adds to dx, and the folded batch norm's input.
template <typename T, int V>
struct BackwardPacks {
  Pack<T, V> x, dy, branch, folded;
};

// One channel's input gradient as an affine map: with z = x scale + shift,
// dx = gamma invstd (dz - Σ dz / rows - x̂ Σ dz x̂ / rows) = dz scale + x x_scale + offset. Five
// constants a channel rather than seven leave registers for a branch's third input.
struct InputGradient {
  float scale, shift, alpha, x_scale, offset;
};

__device__ inline InputGradient input_gradient(const BatchNormPReLUParams& p, int64_t c,
                                               float mean_dz, float mean_dz_xhat) {
  const Channel ch = channel(p, c);
  const float scale = ch.gamma * ch.a;
  return {scale, ch.b * ch.gamma + ch.beta, ch.alpha, -scale * ch.a * mean_dz_xhat,
          -scale * (mean_dz + ch.b * mean_dz_xhat)};
}

// dx from x and dy, plus the branch's gradient where kBranch: the sum of x's two gradients costs no
// pass of its own. Where kFold, also the folded batch norm's sums of dx as stored, Σ dx and
// Σ dx x̂ (a slope of 1: dz is its dy).
template <typename T, int V, bool kBranch, bool kFold>
__global__ void __launch_bounds__(kThreads, 2)
    batch_norm_prelu_backward_input_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                           const T* __restrict__ dbranch, T* __restrict__ dx,
                                           int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                           const float* __restrict__ sums, FoldedSums fold) {
  const Lane l = lane<V>(channels);
  [[maybe_unused]] float s[2][V] = {};
  if (l.pack < l.packs_per_row) {
    const float inv_rows = 1.0f / static_cast<float>(rows);
    InputGradient g[V];
    [[maybe_unused]] float fold_a[V], fold_b[V];  // the folded batch norm's x̂ = input a + b
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = l.pack * V + k;
      g[k] = input_gradient(p, c, sums[c] * inv_rows, sums[channels + c] * inv_rows);
      if constexpr (kFold) {
        fold_a[k] = fold.invstd[c];
        fold_b[k] = -fold.mean[c] * fold_a[k];
      }
    }
    const auto* folded = static_cast<const T*>(fold.input);
    // With the fold's fourth input and sums, two rows at a time would spill registers.
    for_each_lane_row<kFold ? 1 : kRowsAtOnce>(
        l, rows,
        [&](int64_t i) {
          BackwardPacks<T, V> in{load_pack<V>(x + i * V), load_pack<V>(dy + i * V), {}, {}};
          if constexpr (kBranch) in.branch = load_pack<V>(dbranch + i * V);
          if constexpr (kFold) in.folded = load_pack<V>(folded + i * V);
          return in;
        },
        [&](int64_t i, const BackwardPacks<T, V>& in) {
          Pack<T, V> out;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float xv = to_float(in.x.e[k]), dyv = to_float(in.dy.e[k]);
            const float z = xv * g[k].scale + g[k].shift;
            const float dz = z > 0.0f ? dyv : g[k].alpha * dyv;
            float v = dz * g[k].scale + xv * g[k].x_scale + g[k].offset;
            if constexpr (kBranch) v += to_float(in.branch.e[k]);
            out.e[k] = from_float<T>(v);
            if constexpr (kFold) {
              const float stored = to_float(out.e[k]);
              s[0][k] += stored;
              s[1][k] += stored * (to_float(in.folded.e[k]) * fold_a[k] + fold_b[k]);
            }
          }
          store_pack<V>(dx + i * V, out);
        });
  }
  if constexpr (kFold) write_block_sums(s, l, channels, fold.partials);
}

// Row blocks of a reduction at most: partials hold this many rows of sums, as many blocks as can
// be resident on a GPU of up to 2,048 threads per multiprocessor.
int64_t max_reduce_blocks() {
  return (2048 / kThreads) * static_cast<int64_t>(multiprocessors());
}

// A kernel's launch over rows x packs_per_row packs: tx packs side by side (a power of two rows ty,
// for the reductions' tree), gridDim.y row blocks, and the shared memory of the reductions' tree.
struct Launch {
  dim3 grid, block;
  size_t shared = 0;
};

dim3 block_for(int64_t packs_per_row) {
  const unsigned tx =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(packs_per_row, 32)));
  unsigned ty = 1;
  while (ty * 2 * tx <= kThreads) ty *= 2;
  return dim3(tx, ty);
}

// At most `blocks` blocks in all.
dim3 grid_for(int64_t rows, int64_t packs_per_row, const dim3& block, int64_t blocks) {
  const int64_t gx = (packs_per_row + block.x - 1) / block.x;
  const int64_t row_blocks = std::max<int64_t>(1, (rows + block.y - 1) / block.y);
  const int64_t gy = std::max<int64_t>(1, std::min<int64_t>(row_blocks, blocks / gx));
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

// Element-wise passes: enough blocks to fill the GPU a few times over.
Launch elementwise_launch(int64_t rows, int64_t packs_per_row) {
  const dim3 block = block_for(packs_per_row);
  return {grid_for(rows, packs_per_row, block, 8 * static_cast<int64_t>(multiprocessors())), block};
}

// Blocks of `kernel` resident per multiprocessor, asked of the runtime once per kernel, device and
// block shape: the query is a host call, and the reductions run several times in every step.
cudaError_t resident_blocks(const void* kernel, const dim3& block, size_t shared, int* count) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, unsigned, unsigned>, int> counts;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const auto key = std::make_tuple(kernel, device, block.x, block.y);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto known = counts.find(key); known != counts.end()) {
    *count = known->second;
    return cudaSuccess;
  }
  const cudaError_t status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      count, kernel, static_cast<int>(block.x * block.y), shared);
  if (status == cudaSuccess) counts.emplace(key, *count);
  return status;
}

// A reduction of J sums per element over packs of V: the blocks that `kernel` fits on the GPU at
// once, J V floats of shared memory per thread.
template <int J, int V, class Kernel>
cudaError_t reduce_launch(Kernel kernel, int64_t rows, int64_t packs_per_row, Launch* launch) {
  const dim3 block = block_for(packs_per_row);
  const size_t shared = static_cast<size_t>(block.x) * block.y * J * V * sizeof(float);
  int per_multiprocessor = 0;
  const cudaError_t status =
      resident_blocks(reinterpret_cast<const void*>(kernel), block, shared, &per_multiprocessor);
  const int64_t resident =
      std::max(1, per_multiprocessor) * static_cast<int64_t>(multiprocessors());
  *launch = {grid_for(rows, packs_per_row, block, std::min(resident, max_reduce_blocks())), block,
             shared};
  return status;
}

// Calls `launch` with the element type and the widest pack (16 bytes) that the data allow.
template <class Launch>
cudaError_t dispatch(ElementType type, int64_t channels,
                     std::initializer_list<const void*> pointers, Launch&& launch) {
  return with_element_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kWide = 16 / sizeof(T);
    bool wide = true;
    for (const void* p : pointers) wide = wide && packs_fit(channels, kWide, p, sizeof(T));
    return with_pack_width<kWide>(wide, [&](auto v) { return launch(T{}, v); });
  });
}

}  // namespace

int64_t batch_norm_partials(int64_t channels) {
  // The most row blocks of any reduction, three sums a channel; two-sum reductions keep their
  // shift in the third.
  return max_reduce_blocks() * 3 * channels;
}

int64_t batch_norm_shift_offset(int64_t channels) {
  return max_reduce_blocks() * 2 * channels;
}

cudaError_t batch_norm_statistics(const void* x, ElementType type, int64_t rows, int64_t channels,
                                  float eps, float momentum, float* partials, float* mean,
                                  float* invstd, RunningStatistics running, cudaStream_t stream) {
  float* const shift = partials + batch_norm_shift_offset(channels);
  int64_t blocks = 0;
  const cudaError_t status = dispatch(type, channels, {x}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs_per_row = channels / V;
    if (packs_per_row == 0) return cudaSuccess;
    const auto kernel = batch_norm_statistics_kernel<T, V>;
    Launch l;
    if (const cudaError_t e = reduce_launch<2, V>(kernel, rows, packs_per_row, &l);
        e != cudaSuccess)
      return e;
    kernel<<<l.grid, l.block, l.shared, stream>>>(static_cast<const T*>(x), rows, channels,
                                                  partials, shift);
    blocks = l.grid.y;
    return cudaGetLastError();
  });
  if (status != cudaSuccess) return status;
  return batch_norm_statistics_from_sums(partials, shift, blocks, rows, channels, eps, momentum,
                                         mean, invstd, running, stream);
}

cudaError_t batch_norm_statistics_from_sums(const float* sums, const float* shift, int64_t blocks,
                                            int64_t rows, int64_t channels, float eps,
                                            float momentum, float* mean, float* invstd,
                                            RunningStatistics running, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  batch_norm_statistics_finish_kernel<<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
      sums, shift, blocks, rows, channels, eps, momentum, mean, invstd, running);
  return cudaGetLastError();
}

cudaError_t batch_norm_prelu_forward(const void* x, const void* residual, void* y, ElementType type,
                                     int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                     OutputSums* sums, cudaStream_t stream) {
  return dispatch(type, channels, {x, residual, y}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs_per_row = channels / V;
    if (packs_per_row == 0) return cudaSuccess;
    const auto* xs = static_cast<const T*>(x);
    const auto* rs = static_cast<const T*>(residual);
    auto* ys = static_cast<T*>(y);
    if (sums == nullptr) {
      const Launch l = elementwise_launch(rows, packs_per_row);
      const auto kernel = residual != nullptr ? batch_norm_prelu_forward_kernel<T, V, true, false>
                                              : batch_norm_prelu_forward_kernel<T, V, false, false>;
      kernel<<<l.grid, l.block, 0, stream>>>(xs, rs, ys, rows, channels, p, nullptr, nullptr);
      return cudaGetLastError();
    }
    const auto kernel = residual != nullptr ? batch_norm_prelu_forward_kernel<T, V, true, true>
                                            : batch_norm_prelu_forward_kernel<T, V, false, true>;
    Launch l;
    if (const cudaError_t e = reduce_launch<2, V>(kernel, rows, packs_per_row, &l);
        e != cudaSuccess)
      return e;
    kernel<<<l.grid, l.block, l.shared, stream>>>(
        xs, rs, ys, rows, channels, p, sums->partials,
        sums->partials + batch_norm_shift_offset(channels));
    sums->blocks = l.grid.y;
    return cudaGetLastError();
  });
}

cudaError_t batch_norm_prelu_backward_reduce(const void* x, const void* dy, ElementType type,
                                             int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                             float* partials, float* sums, cudaStream_t stream) {
  return dispatch(type, channels, {x, dy}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs_per_row = channels / V;
    if (packs_per_row == 0) return cudaSuccess;
    const auto kernel = batch_norm_prelu_backward_reduce_kernel<T, V>;
    Launch l;
    if (const cudaError_t e = reduce_launch<3, V>(kernel, rows, packs_per_row, &l);
        e != cudaSuccess)
      return e;
    kernel<<<l.grid, l.block, l.shared, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), rows, channels, p, partials);
    batch_norm_backward_sums_kernel<3><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        partials, l.grid.y, channels, sums);
    return cudaGetLastError();
  });
}

cudaError_t batch_norm_prelu_backward_input(const void* x, const void* dy, const void* dbranch,
                                            void* dx, ElementType type, int64_t rows,
                                            int64_t channels, BatchNormPReLUParams p,
                                            const float* sums, const FoldedSums* fold,
                                            cudaStream_t stream) {
  const void* folded = fold != nullptr ? fold->input : nullptr;
  return dispatch(type, channels, {x, dy, dbranch, dx, folded}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs_per_row = channels / V;
    if (packs_per_row == 0) return cudaSuccess;
    const auto* xs = static_cast<const T*>(x);
    const auto* dys = static_cast<const T*>(dy);
    const auto* branch = static_cast<const T*>(dbranch);
    auto* dxs = static_cast<T*>(dx);
    if (fold == nullptr) {
      const Launch l = elementwise_launch(rows, packs_per_row);
      const auto kernel = dbranch != nullptr
                              ? batch_norm_prelu_backward_input_kernel<T, V, true, false>
                              : batch_norm_prelu_backward_input_kernel<T, V, false, false>;
      kernel<<<l.grid, l.block, 0, stream>>>(xs, dys, branch, dxs, rows, channels, p, sums,
                                             FoldedSums{});
      return cudaGetLastError();
    }
    const auto kernel = dbranch != nullptr
                            ? batch_norm_prelu_backward_input_kernel<T, V, true, true>
                            : batch_norm_prelu_backward_input_kernel<T, V, false, true>;
    Launch l;
    if (const cudaError_t e = reduce_launch<2, V>(kernel, rows, packs_per_row, &l);
        e != cudaSuccess)
      return e;
    kernel<<<l.grid, l.block, l.shared, stream>>>(xs, dys, branch, dxs, rows, channels, p, sums,
                                                  *fold);
    batch_norm_backward_sums_kernel<2><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        fold->partials, l.grid.y, channels, fold->sums);
    return cudaGetLastError();
  });
}

}  // namespace myriad::cuda
