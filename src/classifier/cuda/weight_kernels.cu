// Row kernels over the weight shard (float32 or bfloat16): the GEMM copy of a chunk's rows, and
// the optimizer updates fused with the backward of the row normalisation, one warp per row.
//
// Each lane handles kWidth consecutive elements at a time (k = kWidth * lane + 32 * kWidth * i):
// with kWidth = 4, every access is one 8- or 16-byte load or store, which the memory system
// serves far better than 4 separate ones. It needs D % 4 == 0 and aligned rows; otherwise
// kWidth = 1.

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "row_update.cuh"

namespace myriad::cuda {

namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kRowsPerBlock * 32;
// Groups of 4 elements a lane keeps in registers through sgd_rows_kernel: rows up to 512 wide,
// the embedding sizes of face recognition, are read once.
constexpr int kHeldGroups = 4;

__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

struct RowSlot {
  int64_t row;  // which of the `count` rows, or -1 past the end
  int64_t src;  // its row in the shard
  int lane;
};

__device__ inline RowSlot row_slot(const int64_t* index, int64_t begin, int64_t count) {
  RowSlot slot;
  slot.row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  slot.lane = threadIdx.x % 32;
  if (slot.row >= count) {
    slot.row = -1;
    return slot;
  }
  slot.src = index != nullptr ? index[begin + slot.row] : begin + slot.row;
  return slot;
}

// The rows' 1/|w|, which prepare_rows_kernel measures and sgd_rows_kernel writes as it stores the
// rows: one sum and one rounding for both, on which the next forward's norms and copies from the
// update rest bit for bit (ShardedMarginSoftmax::norms_from_update, copy_from_update).
template <int kWidth>
__device__ inline void add_squares(float& squares, const float (&v)[kWidth]) {
#pragma unroll
  for (int j = 0; j < kWidth; ++j) squares += v[j] * v[j];
}

__device__ inline float row_inv_norm(float lane_squares) {
  return inverse_norm(warp_sum(lane_squares));
}

// The first element of each of this lane's groups of kWidth.
template <int kWidth, typename F>
__device__ inline void for_each_group(int64_t dim, int lane, F&& f) {
  for (int64_t k = static_cast<int64_t>(lane) * kWidth; k < dim; k += 32 * kWidth) f(k);
}

template <int kWidth, typename In, typename Out>
__global__ void prepare_rows_kernel(const In* __restrict__ weight, int64_t dim,
                                    const int64_t* __restrict__ index, int64_t begin, int64_t count,
                                    bool normalize, Out* __restrict__ out,
                                    float* __restrict__ inv_norms) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  const In* w = weight + slot.src * dim;
  float scale = 1.0f;
  if (normalize || inv_norms != nullptr) {
    float squares = 0.0f;
    for_each_group<kWidth>(dim, slot.lane, [&](int64_t k) {
      float v[kWidth];
      load_floats(w + k, v);
      add_squares(squares, v);
    });
    const float inv_norm = row_inv_norm(squares);
    if (inv_norms != nullptr && slot.lane == 0) inv_norms[slot.row] = inv_norm;
    if (normalize) scale = inv_norm;
  }
  if (out == nullptr) return;
  Out* o = out + slot.row * dim;
  for_each_group<kWidth>(dim, slot.lane, [&](int64_t k) {
    float v[kWidth];
    load_floats(w + k, v);
#pragma unroll
    for (int j = 0; j < kWidth; ++j) v[j] *= scale;
    store_floats(o + k, v);
  });
}

// Whether row_gradient reads the row: a gradient of kRow needs no sums over it.
__device__ inline bool reads_row(RowGradient grad_of) {
  return grad_of != RowGradient::kRow;
}

// A lane's w and g: with kGroups > 0 its groups of a row of at most 32 * kWidth * kGroups elements,
// kept in registers from row_gradient's pass to the update's, so that the update reads them from
// memory once, all in flight together; with kGroups = 0 each pass reads them again.
template <int kWidth, int kGroups>
struct LaneRow {
  static constexpr int kSlots = kGroups > 0 ? kGroups : 1;
  // The widest row held (kGroups > 0).
  static constexpr int64_t max_dim() { return 32 * kWidth * kGroups; }
  float w[kSlots][kWidth], g[kSlots][kWidth];

  // Whether row_gradient left the row in registers.
  static __device__ bool held(RowGradient grad_of) { return kGroups > 0 && reads_row(grad_of); }

  template <typename W, typename G>
  __device__ void load(int slot, const W* wp, const G* gp) {
    load_floats(wp, w[slot]);
    load_floats(gp, g[slot]);
  }
};

// f(slot, k) for the first element k of each of this lane's groups of kWidth, in order: with
// kGroups > 0 unrolled, group i in slot i; else in a loop, every group in slot 0.
template <int kWidth, int kGroups, typename F>
__device__ inline void for_each_slot(int64_t dim, int lane, F&& f) {
  if constexpr (kGroups > 0) {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const int64_t k = (static_cast<int64_t>(lane) + 32 * i) * kWidth;
      if (k < dim) f(i, k);
    }
  } else {
    for_each_group<kWidth>(dim, lane, [&](int64_t k) { f(0, k); });
  }
}

template <int kWidth, int kGroups, typename W, typename G>
__device__ inline RowGradientOf row_gradient(const W* w, const G* g, int64_t dim, int lane,
                                             RowGradient grad_of, const float* multiplier,
                                             LaneRow<kWidth, kGroups>& row) {
  float squares = 0.0f, dot = 0.0f;
  if (!reads_row(grad_of)) return row_gradient_of(dot, squares, grad_of, multiplier);
  for_each_slot<kWidth, kGroups>(dim, lane, [&](int i, int64_t k) {
    row.load(i, w + k, g + k);
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      squares += row.w[i][j] * row.w[i][j];
      dot += row.w[i][j] * row.g[i][j];
    }
  });
  return row_gradient_of(warp_sum(dot), warp_sum(squares), grad_of, multiplier);
}

// A row's copy for the next forward, in the GEMM dtype: a choice at run time, so that the update
// kernels' instantiations do not multiply by it.
template <int kWidth>
__device__ inline void store_copy(const NextForwardRows& next, int64_t at,
                                  const float (&v)[kWidth]) {
  if (next.copy_type == ElementType::kBFloat16) {
    store_floats(static_cast<__nv_bfloat16*>(next.copy) + at, v);
  } else if (next.copy_type == ElementType::kFloat16) {
    store_floats(static_cast<__half*>(next.copy) + at, v);
  } else {
    store_floats(static_cast<float*>(next.copy) + at, v);
  }
}

template <int kWidth, int kGroups, typename W, typename State, typename G>
__global__ void sgd_rows_kernel(W* __restrict__ weight, WeightStore store_weight,
                                State* __restrict__ momentum, const G* __restrict__ grad,
                                int64_t dim, const int64_t* __restrict__ index, int64_t begin,
                                int64_t count, RowGradient grad_of, SgdArgs args,
                                NextForwardRows next) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  W* w = weight + slot.src * dim;
  const G* g = grad + slot.row * dim;
  const int64_t first_element = (store_weight.first_row + slot.src) * dim;
  LaneRow<kWidth, kGroups> row;
  const RowGradientOf dw = row_gradient(w, g, dim, slot.lane, grad_of, args.grad_multiplier, row);
  State* buf = momentum != nullptr ? momentum + slot.src * dim : nullptr;
  const bool held = LaneRow<kWidth, kGroups>::held(grad_of);
  const bool measures = next.inv_norms != nullptr || next.copy != nullptr;
  float squares = 0.0f;
  for_each_slot<kWidth, kGroups>(dim, slot.lane, [&](int i, int64_t k) {
    float bv[kWidth];
    if (!held) row.load(i, w + k, g + k);
    if (buf != nullptr) load_floats(buf + k, bv);
    float* wv = row.w[i];
#pragma unroll
    for (int j = 0; j < kWidth; ++j)
      wv[j] = sgd_element(wv[j], row.g[i][j], dw, args, buf != nullptr ? &bv[j] : nullptr);
    if (buf != nullptr) store_floats(buf + k, bv);
    store_weight(w + k, row.w[i], first_element + k);
    if (measures) {
      // The values as stored, read back by the thread that stored them.
      load_floats(w + k, row.w[i]);
      add_squares(squares, row.w[i]);
    }
  });
  if (!measures) return;
  const float inv_norm = row_inv_norm(squares);
  if (next.inv_norms != nullptr && slot.lane == 0) next.inv_norms[slot.src] = inv_norm;
  if (next.copy == nullptr) return;
  const float scale = next.normalize ? inv_norm : 1.0f;
  for_each_slot<kWidth, kGroups>(dim, slot.lane, [&](int i, int64_t k) {
    // Held rows keep their stored values in registers; wider ones are read again.
    if constexpr (kGroups == 0) load_floats(w + k, row.w[i]);
    float v[kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) v[j] = row.w[i][j] * scale;
    store_copy(next, slot.src * dim + k, v);
  });
}

template <int kWidth, typename W, typename State, typename G>
__global__ void adamw_rows_kernel(W* __restrict__ weight, WeightStore store_weight,
                                  State* __restrict__ exp_avg, State* __restrict__ exp_avg_sq,
                                  const G* __restrict__ grad, int64_t dim,
                                  const int64_t* __restrict__ index, int64_t begin, int64_t count,
                                  RowGradient grad_of, AdamWArgs args) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  W* w = weight + slot.src * dim;
  const G* g = grad + slot.row * dim;
  const int64_t first_element = (store_weight.first_row + slot.src) * dim;
  LaneRow<kWidth, 0> row;
  const RowGradientOf dw = row_gradient(w, g, dim, slot.lane, grad_of, args.grad_multiplier, row);
  State* m = exp_avg + slot.src * dim;
  State* v = exp_avg_sq + slot.src * dim;
  const AdamWStep s = adamw_step(args);
  for_each_group<kWidth>(dim, slot.lane, [&](int64_t k) {
    float wv[kWidth], gv[kWidth], mv[kWidth], vv[kWidth];
    load_floats(w + k, wv);
    load_floats(g + k, gv);
    load_floats(m + k, mv);
    load_floats(v + k, vv);
#pragma unroll
    for (int j = 0; j < kWidth; ++j)
      wv[j] = adamw_element(wv[j], dw(wv[j], gv[j]), &mv[j], &vv[j], args, s);
    store_floats(m + k, mv);
    store_floats(v + k, vv);
    store_weight(w + k, wv, first_element + k);
  });
}

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>((count + kRowsPerBlock - 1) / kRowsPerBlock);
}

// sgd_rows_kernel for rows of `dim`: held in registers where they fit, else streamed.
template <int kWidth, typename W, typename State, typename G>
void launch_sgd_rows(W* weight, WeightStore store, State* momentum, const G* grad, int64_t dim,
                     const int64_t* index, int64_t begin, int64_t count, RowGradient grad_of,
                     const SgdArgs& args, const NextForwardRows& next, cudaStream_t stream) {
  const auto launch = [&](auto kernel) {
    kernel<<<blocks_for(count), kThreads, 0, stream>>>(weight, store, momentum, grad, dim, index,
                                                       begin, count, grad_of, args, next);
  };
  if constexpr (kWidth == 4) {
    if (dim <= LaneRow<kWidth, kHeldGroups>::max_dim())
      return launch(sgd_rows_kernel<kWidth, kHeldGroups, W, State, G>);
  }
  launch(sgd_rows_kernel<kWidth, 0, W, State, G>);
}

// with_element_type for the types that weights, optimizer state and rows' gradients are stored in
// (callers reject float16).
template <typename F>
void with_storage_type(ElementType type, F&& f) {
  if (type == ElementType::kBFloat16) {
    f(static_cast<__nv_bfloat16*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

// Calls f(std::integral_constant<int, kWidth>): 4 when every row of every array (pointer, element
// bytes) starts on a boundary of 4 elements, else 1.
template <typename F>
void with_width(int64_t dim, std::initializer_list<std::pair<const void*, int>> arrays, F&& f) {
  bool wide = true;
  for (const auto& [pointer, element_bytes] : arrays)
    wide = wide && packs_fit(dim, 4, pointer, element_bytes);
  with_pack_width<4>(wide, std::forward<F>(f));
}

int bytes_of(ElementType type) {
  return type == ElementType::kFloat32 ? 4 : 2;
}

}  // namespace

cudaError_t prepare_rows(const void* weight, ElementType weight_type, int64_t dim,
                         const int64_t* index, int64_t begin, int64_t count, bool normalize,
                         void* out, ElementType out_type, float* inv_norms, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (weight_type == ElementType::kFloat16) return cudaErrorInvalidValue;
  with_storage_type(weight_type, [&](auto* in_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    with_element_type(out_type, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      with_width(
          dim, {{weight, bytes_of(weight_type)}, {out, bytes_of(out_type)}}, [&](auto width) {
            prepare_rows_kernel<decltype(width)::value><<<blocks_for(count), kThreads, 0, stream>>>(
                static_cast<const In*>(weight), dim, index, begin, count, normalize,
                static_cast<Out*>(out), inv_norms);
          });
    });
  });
  return cudaGetLastError();
}

cudaError_t sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                     const void* grad, ElementType grad_type, int64_t dim, const int64_t* index,
                     int64_t begin, int64_t count, RowGradient grad_of, SgdArgs args,
                     cudaStream_t stream, const NextForwardRows& next, bool* next_written) {
  if (next_written != nullptr) *next_written = false;
  if (count == 0) return cudaSuccess;
  if (weight.type == ElementType::kFloat16 || momentum_type == ElementType::kFloat16 ||
      grad_type == ElementType::kFloat16) {
    return cudaErrorInvalidValue;
  }
  const WeightStore store{weight.first_row, weight.rounding_seed};
  with_storage_type(weight.type, [&](auto* w_tag) {
    using W = std::remove_pointer_t<decltype(w_tag)>;
    with_storage_type(momentum_type, [&](auto* s_tag) {
      using State = std::remove_pointer_t<decltype(s_tag)>;
      with_storage_type(grad_type, [&](auto* g_tag) {
        using G = std::remove_pointer_t<decltype(g_tag)>;
        with_width(dim,
                   {{weight.data, bytes_of(weight.type)},
                    {momentum, bytes_of(momentum_type)},
                    {grad, bytes_of(grad_type)},
                    {next.copy, bytes_of(next.copy_type)}},
                   [&](auto width) {
                     constexpr int kWidth = decltype(width)::value;
                     // prepare_rows sums in packs of 4 wherever the weights allow them.
                     const bool same_order =
                         (kWidth == 4) == packs_fit(dim, 4, weight.data, bytes_of(weight.type));
                     const NextForwardRows taken = same_order ? next : NextForwardRows{};
                     if (next_written != nullptr)
                       *next_written = taken.inv_norms != nullptr || taken.copy != nullptr;
                     launch_sgd_rows<kWidth>(static_cast<W*>(weight.data), store,
                                             static_cast<State*>(momentum),
                                             static_cast<const G*>(grad), dim, index, begin, count,
                                             grad_of, args, taken, stream);
                   });
      });
    });
  });
  return cudaGetLastError();
}

cudaError_t adamw_rows(WeightShard weight, void* exp_avg, void* exp_avg_sq, ElementType state_type,
                       const void* grad, ElementType grad_type, int64_t dim, const int64_t* index,
                       int64_t begin, int64_t count, RowGradient grad_of, AdamWArgs args,
                       cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (weight.type == ElementType::kFloat16 || state_type == ElementType::kFloat16 ||
      grad_type == ElementType::kFloat16) {
    return cudaErrorInvalidValue;
  }
  const WeightStore store{weight.first_row, weight.rounding_seed};
  with_storage_type(weight.type, [&](auto* w_tag) {
    using W = std::remove_pointer_t<decltype(w_tag)>;
    with_storage_type(state_type, [&](auto* s_tag) {
      using State = std::remove_pointer_t<decltype(s_tag)>;
      with_storage_type(grad_type, [&](auto* g_tag) {
        using G = std::remove_pointer_t<decltype(g_tag)>;
        with_width(dim,
                   {{weight.data, bytes_of(weight.type)},
                    {exp_avg, bytes_of(state_type)},
                    {exp_avg_sq, bytes_of(state_type)},
                    {grad, bytes_of(grad_type)}},
                   [&](auto width) {
                     adamw_rows_kernel<decltype(width)::value>
                         <<<blocks_for(count), kThreads, 0, stream>>>(
                             static_cast<W*>(weight.data), store, static_cast<State*>(exp_avg),
                             static_cast<State*>(exp_avg_sq), static_cast<const G*>(grad), dim,
                             index, begin, count, grad_of, args);
                   });
      });
    });
  });
  return cudaGetLastError();
}

}  // namespace myriad::cuda
