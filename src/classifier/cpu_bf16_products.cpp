#include "cpu_bf16_products.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "myriad/util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MYRIAD_BF16_PRODUCTS 1
// Only these functions use the instructions; the loader's check (cpu_has_bf16_products) guards
// every call, so the rest of the build keeps its baseline target.
#define MYRIAD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace myriad {

#ifdef MYRIAD_BF16_PRODUCTS

namespace {

constexpr int64_t kLanes = 16;  // float32 lanes of a 512-bit register

// One 512-bit register's worth of packed pairs, aligned for its load.
struct alignas(64) Lanes {
  uint32_t v[kLanes];
};

// Rows of classes a task of bf16_rows_by_batch takes: enough to amortise a task, few enough to
// balance the threads.
constexpr int64_t kTaskRows = 512;
// Rows of k that a slice of bf16_long_k packs at a time: 16 KiB of packed pairs at D = 64, which
// stay in the L1 cache while every sample reads them.
constexpr int64_t kChunkRows = 128;

constexpr __mmask16 kAll = 0xffff;

// The first `count` lanes of a register (all 16 from 16 on).
__mmask16 lane_mask(int64_t count) {
  return static_cast<__mmask16>((1u << std::min<int64_t>(count, kLanes)) - 1u);
}

// Asks for `count` elements from `p` on into the L2 cache: the next chunk arrives while this one's
// products run, where packing it waited on memory for most of its time.
MYRIAD_BF16_TARGET void prefetch(const uint16_t* p, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(uint16_t);
  for (int64_t i = 0; i < count; i += kLine)
    _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
}

// Pairs along a row-major [rows, cols] matrix's rows: lane j of (pair q, column block v) holds
// rows 2q and 2q + 1 of column 16 v + j, the first in the low half as vdpbf16ps reads a pair;
// zero past the last row or column. `dst` holds ceil(rows / 2) x ceil(cols / 16) registers.
MYRIAD_BF16_TARGET void pack_row_pairs(Lanes* dst, const uint16_t* src, int64_t rows,
                                       int64_t cols) {
  const int64_t blocks = (cols + kLanes - 1) / kLanes;
  for (int64_t q = 0; 2 * q < rows; ++q) {
    const uint16_t* first = src + 2 * q * cols;
    const bool second = 2 * q + 1 < rows;
    for (int64_t v = 0; v < blocks; ++v) {
      const __mmask16 mask = lane_mask(cols - v * kLanes);
      // The zero-masking forms: GCC 12's unmasked ones start from an undefined register, which
      // its -Wmaybe-uninitialized reports.
      const __m512i low =
          _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(mask, first + v * kLanes));
      // Masked off lanes read nothing: no second row past the last.
      const __m512i high = _mm512_maskz_cvtepu16_epi32(
          kAll, _mm256_maskz_loadu_epi16(second ? mask : 0, first + cols + v * kLanes));
      _mm512_store_si512(dst[q * blocks + v].v,
                         _mm512_or_si512(low, _mm512_maskz_slli_epi32(kAll, high, 16)));
    }
  }
}

// A row-major [rows, cols] matrix's transpose as pack_row_pairs packs a matrix: lane j of
// (pair p, row block u) holds row 16 u + j's columns 2p and 2p + 1.
std::vector<Lanes> pack_column_pairs(const uint16_t* src, int64_t rows, int64_t cols) {
  const int64_t pairs = (cols + 1) / 2, blocks = (rows + kLanes - 1) / kLanes;
  std::vector<Lanes> packed(static_cast<size_t>(pairs * blocks), Lanes{});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t& lane = packed[static_cast<size_t>((c / 2) * blocks + r / kLanes)].v[r % kLanes];
      lane |= uint32_t{src[r * cols + c]} << (16 * (c % 2));
    }
  }
  return packed;
}

// kRows rows by kV column blocks of out[i, c] = sum over k < length of a[i, k] b[k, c], where
// `packed` holds b's pairs along k (pack_row_pairs: [pair][block]). Each a row's pair is read as
// one 32-bit lane; an odd length's last element pairs with zero.
template <int kRows, int kV>
MYRIAD_BF16_TARGET inline void product_tile(float* out, int64_t out_stride, const uint16_t* a,
                                            int64_t length, const Lanes* packed, int64_t blocks,
                                            int64_t v0, int64_t cols) {
  __m512 acc[kRows][kV];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kV; ++v) acc[i][v] = _mm512_setzero_ps();
  const auto accumulate = [&](int64_t q, const uint32_t(&pair)[kRows]) MYRIAD_BF16_TARGET {
    __m512bh b[kV];
    for (int v = 0; v < kV; ++v) b[v] = (__m512bh)_mm512_load_si512(packed[q * blocks + v0 + v].v);
    for (int i = 0; i < kRows; ++i) {
      const __m512bh z = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair[i]));
      for (int v = 0; v < kV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], b[v], z);
    }
  };
  const int64_t pairs = length / 2;
  uint32_t pair[kRows];
  for (int64_t q = 0; q < pairs; ++q) {
    for (int i = 0; i < kRows; ++i) std::memcpy(&pair[i], a + i * length + 2 * q, sizeof pair[i]);
    accumulate(q, pair);
  }
  if (length % 2 != 0) {
    for (int i = 0; i < kRows; ++i) pair[i] = a[i * length + length - 1];
    accumulate(pairs, pair);
  }
  for (int i = 0; i < kRows; ++i) {
    for (int v = 0; v < kV; ++v) {
      const int64_t c = (v0 + v) * kLanes;
      _mm512_mask_storeu_ps(out + i * out_stride + c, lane_mask(cols - c), acc[i][v]);
    }
  }
}

// Rows [begin, end) of out[rows, cols] = a[rows, length] b[length, cols], b packed as above: four
// column blocks at a time against four rows, or one against eight.
MYRIAD_BF16_TARGET void product_rows(float* out, const uint16_t* a, int64_t length,
                                     const Lanes* packed, int64_t cols, int64_t begin,
                                     int64_t end) {
  const int64_t blocks = (cols + kLanes - 1) / kLanes;
  const auto over_rows = [&](int64_t step, auto tile, auto tail, int64_t v0) {
    int64_t r = begin;
    for (; r + step <= end; r += step)
      tile(out + r * cols, cols, a + r * length, length, packed, blocks, v0, cols);
    for (; r < end; ++r)
      tail(out + r * cols, cols, a + r * length, length, packed, blocks, v0, cols);
  };
  for (int64_t v0 = 0; v0 < blocks;) {
    if (blocks - v0 >= 4) {
      over_rows(4, product_tile<4, 4>, product_tile<1, 4>, v0);
      v0 += 4;
    } else {
      over_rows(8, product_tile<8, 1>, product_tile<1, 1>, v0);
      v0 += 1;
    }
  }
}

// kM samples by kV column blocks of sum[m, 16 blocks) += the chunk's pairs: `pa` holds the
// samples' row pairs (a), `pb` the columns' (b).
template <int kM, int kV>
MYRIAD_BF16_TARGET inline void long_k_tile(float* sum, int64_t sum_cols, const Lanes* pa,
                                           int64_t a_blocks, const Lanes* pb, int64_t b_blocks,
                                           int64_t pairs, int64_t i0, int64_t v0) {
  __m512 acc[kM][kV];
  for (int i = 0; i < kM; ++i)
    for (int v = 0; v < kV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q) {
    __m512bh w[kV];
    for (int v = 0; v < kV; ++v) w[v] = (__m512bh)_mm512_load_si512(pb[q * b_blocks + v0 + v].v);
    const Lanes* samples = pa + q * a_blocks;
    for (int i = 0; i < kM; ++i) {
      const int64_t s = i0 + i;
      const __m512bh z =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(samples[s / kLanes].v[s % kLanes]));
      for (int v = 0; v < kV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], w[v], z);
    }
  }
  for (int i = 0; i < kM; ++i) {
    for (int v = 0; v < kV; ++v) {
      float* p = sum + (i0 + i) * sum_cols + (v0 + v) * kLanes;
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), acc[i][v]));
    }
  }
}

// sum[m, 16 ceil(n / 16)) += a[k, m]^T b[k, n] over rows [begin, end) of k, a chunk at a time.
MYRIAD_BF16_TARGET void long_k_slice(float* sum, const uint16_t* a, const uint16_t* b,
                                     int64_t begin, int64_t end, int64_t m, int64_t n) {
  const int64_t a_blocks = (m + kLanes - 1) / kLanes, b_blocks = (n + kLanes - 1) / kLanes;
  constexpr int64_t kPairs = kChunkRows / 2;
  std::vector<Lanes> pa(static_cast<size_t>(kPairs * a_blocks));
  std::vector<Lanes> pb(static_cast<size_t>(kPairs * b_blocks));
  for (int64_t r = begin; r < end; r += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, end - r), pairs = (rows + 1) / 2;
    pack_row_pairs(pa.data(), a + r * m, rows, m);
    pack_row_pairs(pb.data(), b + r * n, rows, n);
    const int64_t next = std::min(kChunkRows, end - r - rows);
    prefetch(a + (r + rows) * m, next * m);
    prefetch(b + (r + rows) * n, next * n);
    for (int64_t i0 = 0; i0 < m;) {
      const bool four = m - i0 >= 4;
      for (int64_t v0 = 0; v0 < b_blocks;) {
        const bool wide = b_blocks - v0 >= 4;
        const auto tile = four ? (wide ? long_k_tile<4, 4> : long_k_tile<4, 1>)
                               : (wide ? long_k_tile<1, 4> : long_k_tile<1, 1>);
        tile(sum, b_blocks * kLanes, pa.data(), a_blocks, pb.data(), b_blocks, pairs, i0, v0);
        v0 += wide ? 4 : 1;
      }
      i0 += four ? 4 : 1;
    }
  }
}

const uint16_t* raw(const c10::BFloat16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

}  // namespace

bool cpu_has_bf16_products() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

void bf16_rows_by_batch(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t rows,
                        int64_t batch, int64_t dim) {
  MYRIAD_CHECK(cpu_has_bf16_products(), "this CPU has no bfloat16 pair products (AVX512-BF16)");
  const std::vector<Lanes> x = pack_column_pairs(raw(b), batch, dim);
  at::parallel_for(0, rows, kTaskRows, [&](int64_t begin, int64_t end) {
    product_rows(out, raw(a), dim, x.data(), batch, begin, end);
  });
}

void bf16_rows_by_matrix(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t rows,
                         int64_t length, int64_t cols) {
  MYRIAD_CHECK(cpu_has_bf16_products(), "this CPU has no bfloat16 pair products (AVX512-BF16)");
  std::vector<Lanes> packed(static_cast<size_t>((length + 1) / 2 * ((cols + kLanes - 1) / kLanes)));
  pack_row_pairs(packed.data(), raw(b), length, cols);
  product_rows(out, raw(a), length, packed.data(), cols, 0, rows);
}

void bf16_long_k(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t k, int64_t m,
                 int64_t n, bool accumulate) {
  MYRIAD_CHECK(cpu_has_bf16_products(), "this CPU has no bfloat16 pair products (AVX512-BF16)");
  const int64_t cols = (n + kLanes - 1) / kLanes * kLanes;
  const int64_t slices =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), k / (4 * kChunkRows)));
  std::vector<std::vector<float>> sums(static_cast<size_t>(slices));
  at::parallel_for(0, slices, 1, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      std::vector<float>& sum = sums[static_cast<size_t>(s)];
      sum.assign(static_cast<size_t>(m * cols), 0.0f);
      long_k_slice(sum.data(), raw(a), raw(b), k * s / slices, k * (s + 1) / slices, m, n);
    }
  });
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float product = 0.0f;
      for (const std::vector<float>& sum : sums) product += sum[static_cast<size_t>(i * cols + j)];
      out[i * n + j] = accumulate ? out[i * n + j] + product : product;
    }
  }
}

#else

bool cpu_has_bf16_products() {
  return false;
}

void bf16_rows_by_batch(float*, const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t,
                        int64_t) {
  MYRIAD_THROW("bfloat16 pair products are built only for x86-64");
}

void bf16_rows_by_matrix(float*, const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t,
                         int64_t) {
  MYRIAD_THROW("bfloat16 pair products are built only for x86-64");
}

void bf16_long_k(float*, const c10::BFloat16*, const c10::BFloat16*, int64_t, int64_t, int64_t,
                 bool) {
  MYRIAD_THROW("bfloat16 pair products are built only for x86-64");
}

#endif

bool cpu_pair_products(c10::ScalarType gemm_dtype) {
  return gemm_dtype == c10::ScalarType::BFloat16 && cpu_has_bf16_products();
}

}  // namespace myriad
