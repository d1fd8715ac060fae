#include "cpu_row_update.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "myriad/util/error.h"
#include "myriad/util/stochastic_round.h"

namespace myriad {

namespace {

// Rows one thread takes at a time: enough to amortise its scratch, few enough to share a chunk.
constexpr int64_t kRowsPerTask = 256;

inline float to_float(float v) {
  return v;
}
inline float to_float(c10::BFloat16 v) {
  return static_cast<float>(v);
}

// Optimizer state rounds to nearest, as LibTorch's conversions do.
inline void store_state(float* p, float v) {
  *p = v;
}
inline void store_state(c10::BFloat16* p, float v) {
  *p = c10::BFloat16(v);
}

// hashes[j] = mix32((low + j) ^ upper) for j < n: a row's hashes in a loop of their own, apart
// from the stores that read them.
void hash_pairs(uint32_t* hashes, uint32_t low, uint32_t upper, int64_t n) {
  for (int64_t j = 0; j < n; ++j) hashes[j] = mix32((low + static_cast<uint32_t>(j)) ^ upper);
}

// A row of weights stored: float32 as it is, bfloat16 rounded stochastically by global element
// (rounding_bits: one hash per pair of elements). `hashes` is scratch for the row's pairs.
inline void store_row(float* p, const float* w, int64_t dim, uint64_t, int64_t, uint32_t*) {
  std::copy(w, w + dim, p);
}
inline void store_row(c10::BFloat16* p, const float* w, int64_t dim, uint64_t seed, int64_t element,
                      uint32_t* hashes) {
  const int64_t first_pair = element / 2;
  const int64_t pairs = (element + dim - 1) / 2 - first_pair + 1;
  const uint64_t key = seed + static_cast<uint64_t>(first_pair);
  const uint32_t low = static_cast<uint32_t>(key), high = static_cast<uint32_t>(key >> 32);
  // pair_rounding_bits with the key's upper half hashed once: it is the row's unless the lower
  // half wraps within the row.
  if (low <= ~uint32_t{0} - static_cast<uint32_t>(pairs - 1)) {
    hash_pairs(hashes, low, mix32(high), pairs);
  } else {
    for (int64_t j = 0; j < pairs; ++j) hashes[j] = pair_rounding_bits(seed, first_pair + j);
  }
  // Element k's pair is (element + k) / 2 - first_pair: k's own half where element is even.
  const int64_t odd = element & 1;
  for (int64_t k = 0; k < dim; ++k) {
    p[k].x = bf16_bits_stochastic(w[k], pair_half(hashes[(k + odd) >> 1], k + odd));
  }
}

// A row's sums of w.w and w.g, in kLanes interleaved partial sums that the compiler keeps in
// vector registers (one running sum serialises every addition).
struct RowSums {
  float squares, dot;
};

inline RowSums row_sums(const float* w, const float* g, int64_t dim) {
  constexpr int kLanes = 8;
  float squares[kLanes] = {}, dot[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= dim; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      squares[j] += w[k + j] * w[k + j];
      dot[j] += w[k + j] * g[k + j];
    }
  }
  for (; k < dim; ++k) {
    squares[0] += w[k] * w[k];
    dot[0] += w[k] * g[k];
  }
  RowSums sums{0.0f, 0.0f};
  for (int j = 0; j < kLanes; ++j) {
    sums.squares += squares[j];
    sums.dot += dot[j];
  }
  return sums;
}

// Calls f with a null pointer of the C++ type `t` is stored in: float32 or bfloat16.
template <class F>
void with_storage(const torch::Tensor& t, F&& f) {
  if (t.scalar_type() == torch::kBFloat16) {
    f(static_cast<c10::BFloat16*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

// Walks the rows: loads each row and its gradient into float32 scratch, takes the sums that its
// gradient's direction needs, calls update(shard row, w, g, dw), which updates w in place (and
// the row's state), and stores w.
template <typename W, typename G, class Update>
void for_each_row(const CpuRowUpdate& r, const float* multiplier, Update&& update) {
  W* weight = r.weight.data_ptr<W>();
  const G* grad = r.grad.data_ptr<G>();
  const int64_t* index = r.index.defined() ? r.index.data_ptr<int64_t>() : nullptr;
  const int64_t dim = r.weight.size(1);
  at::parallel_for(r.begin, r.end, kRowsPerTask, [&](int64_t first, int64_t last) {
    std::vector<float> w(dim), g(dim);
    std::vector<uint32_t> hashes(dim / 2 + 2);
    for (int64_t i = first; i < last; ++i) {
      const int64_t row = index != nullptr ? index[i] : i;
      W* stored = weight + row * dim;
      const G* gradient = grad + (i - r.begin) * dim;
      for (int64_t k = 0; k < dim; ++k) {
        w[k] = to_float(stored[k]);
        g[k] = to_float(gradient[k]);
      }
      const RowSums sums = row_sums(w.data(), g.data(), dim);
      update(row, w.data(), g.data(),
             row_gradient_of(sums.dot, sums.squares, r.grad_of, multiplier));
      store_row(stored, w.data(), dim, r.rounding_seed, (r.first_row + row) * dim, hashes.data());
    }
  });
}

void check_rows(const CpuRowUpdate& r, std::initializer_list<const torch::Tensor*> state) {
  const auto storable = [](const torch::Tensor& t) {
    return (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16) &&
           t.is_contiguous() && t.device().is_cpu();
  };
  MYRIAD_CHECK(storable(r.weight) && storable(r.grad) && r.weight.dim() == 2 &&
                   r.grad.sizes() == torch::IntArrayRef({r.end - r.begin, r.weight.size(1)}),
               "the CPU row update takes contiguous float32 or bfloat16 weights [C, D] and "
               "gradients [{}, D] on the CPU, got {} {} and {} {}",
               r.end - r.begin, r.weight.scalar_type(), r.weight.sizes(), r.grad.scalar_type(),
               r.grad.sizes());
  for (const torch::Tensor* s : state) {
    MYRIAD_CHECK(storable(*s) && s->sizes() == r.weight.sizes(),
                 "the CPU row update's optimizer state must be contiguous float32 or bfloat16 "
                 "{} on the CPU, got {} {}",
                 r.weight.sizes(), s->scalar_type(), s->sizes());
  }
}

}  // namespace

void sgd_rows_cpu(const CpuRowUpdate& rows, torch::Tensor& momentum, const SgdArgs& args) {
  if (momentum.defined()) {
    check_rows(rows, {&momentum});
  } else {
    check_rows(rows, {});
  }
  const int64_t dim = rows.weight.size(1);
  const auto run = [&](auto* w_tag, auto* g_tag, auto* s_tag) {
    using W = std::remove_pointer_t<decltype(w_tag)>;
    using G = std::remove_pointer_t<decltype(g_tag)>;
    using S = std::remove_pointer_t<decltype(s_tag)>;
    S* buffers = momentum.defined() ? momentum.data_ptr<S>() : nullptr;
    for_each_row<W, G>(rows, args.grad_multiplier,
                       [&](int64_t row, float* w, const float* g, const RowGradientOf& dw) {
                         if (buffers == nullptr) {
                           for (int64_t k = 0; k < dim; ++k)
                             w[k] = sgd_element(w[k], g[k], dw, args, nullptr);
                           return;
                         }
                         S* b = buffers + row * dim;
                         for (int64_t k = 0; k < dim; ++k) {
                           float bk = to_float(b[k]);
                           w[k] = sgd_element(w[k], g[k], dw, args, &bk);
                           store_state(b + k, bk);
                         }
                       });
  };
  with_storage(rows.weight, [&](auto* w_tag) {
    with_storage(rows.grad, [&](auto* g_tag) {
      if (!momentum.defined()) return run(w_tag, g_tag, static_cast<float*>(nullptr));
      with_storage(momentum, [&](auto* s_tag) { run(w_tag, g_tag, s_tag); });
    });
  });
}

void adamw_rows_cpu(const CpuRowUpdate& rows, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                    const AdamWArgs& args) {
  check_rows(rows, {&exp_avg, &exp_avg_sq});
  MYRIAD_CHECK(exp_avg.scalar_type() == exp_avg_sq.scalar_type(),
               "AdamW's moments must share a dtype, got {} and {}", exp_avg.scalar_type(),
               exp_avg_sq.scalar_type());
  const int64_t dim = rows.weight.size(1);
  const AdamWStep step = adamw_step(args);
  with_storage(rows.weight, [&](auto* w_tag) {
    with_storage(rows.grad, [&](auto* g_tag) {
      with_storage(exp_avg, [&](auto* s_tag) {
        using W = std::remove_pointer_t<decltype(w_tag)>;
        using G = std::remove_pointer_t<decltype(g_tag)>;
        using S = std::remove_pointer_t<decltype(s_tag)>;
        S* first = exp_avg.data_ptr<S>();
        S* second = exp_avg_sq.data_ptr<S>();
        for_each_row<W, G>(rows, args.grad_multiplier,
                           [&](int64_t row, float* w, const float* g, const RowGradientOf& dw) {
                             S* m = first + row * dim;
                             S* v = second + row * dim;
                             for (int64_t k = 0; k < dim; ++k) {
                               float mk = to_float(m[k]), vk = to_float(v[k]);
                               w[k] = adamw_element(w[k], dw(w[k], g[k]), &mk, &vk, args, step);
                               store_state(m + k, mk);
                               store_state(v + k, vk);
                             }
                           });
      });
    });
  });
}

}  // namespace myriad
