#include "cpu_row_update.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "cpu_bf16_products.h"
#include "myriad/util/cpu_clones.h"
#include "myriad/util/error.h"
#include "myriad/util/stochastic_round.h"
#include "myriad/util/vector_math.h"

namespace myriad {

namespace {

// Rows one thread takes at a time: enough to amortise its scratch, few enough to share a chunk.
constexpr int64_t kRowsPerTask = 256;

MYRIAD_INLINE_LOOP float to_float(float v) {
  return v;
}
MYRIAD_INLINE_LOOP float to_float(c10::BFloat16 v) {
  return static_cast<float>(v);
}

// A row of weights stored: float32 as it is, bfloat16 rounded stochastically by global element
// (rounding_bits: one hash per pair of elements).
MYRIAD_INLINE_LOOP void store_row(float* p, const float* w, int64_t dim, uint64_t, int64_t) {
  std::copy(w, w + dim, p);
}
MYRIAD_INLINE_LOOP void store_row(c10::BFloat16* p, const float* w, int64_t dim, uint64_t seed,
                                  int64_t element) {
  const int64_t first_pair = element / 2;
  const uint64_t key = seed + static_cast<uint64_t>(first_pair);
  const uint32_t low = static_cast<uint32_t>(key), high = static_cast<uint32_t>(key >> 32);
  const uint32_t pairs = static_cast<uint32_t>(dim / 2);
  if ((element & 1) == 0 && dim % 2 == 0 && low <= ~uint32_t{0} - pairs) {
    // pair_rounding_bits with the key's upper half hashed once, as the lower half does not wrap
    // within the row: the even element takes the hash's upper half, the odd one its lower half.
    const uint32_t upper = mix32(high);
    for (int64_t j = 0; j < dim / 2; ++j) {
      const uint32_t hash = mix32((low + static_cast<uint32_t>(j)) ^ upper);
      p[2 * j].x = bf16_bits_stochastic(w[2 * j], hash >> 16);
      p[2 * j + 1].x = bf16_bits_stochastic(w[2 * j + 1], hash);
    }
    return;
  }
  for (int64_t k = 0; k < dim; ++k)
    p[k].x = bf16_bits_stochastic(w[k], rounding_bits(seed, element + k));
}

// Columns [k0, ...) of a row's gradient g = sum over b of dz[b] x[b] (x [width, dim]), in
// float32 as a GEMM forms it, kLanes at a time, whose sums stay in vector registers across the
// batch; returns the first column left.
template <int64_t kLanes, typename G>
MYRIAD_INLINE_LOOP int64_t product_columns(const G* __restrict__ dz, const float* __restrict__ x,
                                           int64_t width, int64_t dim, int64_t k0,
                                           float* __restrict__ g) {
  for (; k0 + kLanes <= dim; k0 += kLanes) {
    float sums[kLanes] = {};
    for (int64_t b = 0; b < width; ++b) {
      const float d = to_float(dz[b]);
      for (int64_t j = 0; j < kLanes; ++j) sums[j] += d * x[b * dim + k0 + j];
    }
    std::copy(sums, sums + kLanes, g + k0);
  }
  return k0;
}

template <typename G>
MYRIAD_INLINE_LOOP void row_product(const G* dz, const float* x, int64_t width, int64_t dim,
                                    float* g) {
  const int64_t k0 = product_columns<64>(dz, x, width, dim, 0, g);
  product_columns<1>(dz, x, width, dim, product_columns<16>(dz, x, width, dim, k0, g), g);
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

// A task's float32 scratch: a row's w and g, and, where the features are bfloat16, the gradients
// of a block of rows formed at once by the CPU's bf16 pair products.
class TaskScratch {
 public:
  explicit TaskScratch(const CpuRowUpdate& r) : r_(r), w_(r.weight.size(1)), g_(w_.size()) {
    if (pairs()) products_.resize(static_cast<size_t>(kRowsPerTask) * w_.size());
  }

  float* w() { return w_.data(); }
  float* g() { return g_.data(); }
  // Float32 features for the row loop's products, or null.
  const float* features() const {
    return r_.features.defined() && !pairs() ? r_.features.data_ptr<float>() : nullptr;
  }
  // The gradients of rows [first, last) (at most kRowsPerTask), row after row, or null where the
  // row loop forms them.
  const float* products(int64_t first, int64_t last) {
    if (!pairs()) return nullptr;
    const int64_t width = r_.grad.size(1);
    bf16_rows_by_matrix(
        products_.data(), r_.grad.data_ptr<c10::BFloat16>() + (first - r_.begin) * width,
        r_.features.data_ptr<c10::BFloat16>(), last - first, width, r_.weight.size(1));
    return products_.data();
  }

 private:
  bool pairs() const {
    return r_.features.defined() && r_.features.scalar_type() == torch::kBFloat16;
  }

  const CpuRowUpdate& r_;
  std::vector<float> w_, g_, products_;
};

// Rows [first, last) of for_each_row; `products` holds their gradients, else they are formed here.
template <typename W, typename G, class Update>
MYRIAD_CPU_CLONES void update_row_range(const CpuRowUpdate& r, const float* multiplier,
                                        Update& update, int64_t first, int64_t last,
                                        TaskScratch& scratch, const float* products) {
  W* weight = r.weight.data_ptr<W>();
  const G* grad = r.grad.data_ptr<G>();
  const int64_t* index = r.index.defined() ? r.index.data_ptr<int64_t>() : nullptr;
  const float* features = scratch.features();
  const int64_t dim = r.weight.size(1), width = r.grad.size(1);
  float* w = scratch.w();
  for (int64_t i = first; i < last; ++i) {
    const int64_t row = index != nullptr ? index[i] : i;
    W* stored = weight + row * dim;
    const G* gradient = grad + (i - r.begin) * width;
    for (int64_t k = 0; k < dim; ++k) w[k] = to_float(stored[k]);
    float* formed = scratch.g();
    const float* g = formed;
    if (products != nullptr) {
      g = products + (i - first) * dim;
    } else if (features != nullptr) {
      row_product(gradient, features, width, dim, formed);
    } else {
      for (int64_t k = 0; k < dim; ++k) formed[k] = to_float(gradient[k]);
    }
    const RowSums sums = row_sums(w, g, dim);
    update(row, w, g, row_gradient_of(sums.dot, sums.squares, r.grad_of, multiplier));
    store_row(stored, w, dim, r.rounding_seed, (r.first_row + row) * dim);
  }
}

// Walks the rows: loads each row and its gradient into float32 scratch, takes the sums that its
// gradient's direction needs, calls update(shard row, w, g, dw), which updates w in place (and
// the row's state), and stores w.
template <typename W, typename G, class Update>
void for_each_row(const CpuRowUpdate& r, const float* multiplier, Update&& update) {
  at::parallel_for(r.begin, r.end, kRowsPerTask, [&](int64_t first, int64_t last) {
    TaskScratch scratch(r);
    for (int64_t block = first; block < last; block += kRowsPerTask) {
      const int64_t end = std::min(block + kRowsPerTask, last);
      update_row_range<W, G>(r, multiplier, update, block, end, scratch,
                             scratch.products(block, end));
    }
  });
}

void check_rows(const CpuRowUpdate& r, std::initializer_list<const torch::Tensor*> state) {
  const auto storable = [](const torch::Tensor& t) {
    return (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16) &&
           t.is_contiguous() && t.device().is_cpu();
  };
  MYRIAD_CHECK(storable(r.weight) && storable(r.grad) && r.weight.dim() == 2 && r.grad.dim() == 2 &&
                   r.grad.size(0) == r.end - r.begin &&
                   r.grad.size(1) == (r.features.defined() ? r.features.size(0) : r.weight.size(1)),
               "the CPU row update takes contiguous float32 or bfloat16 weights [C, D] and "
               "gradients [{}, {}] on the CPU, got {} {} and {} {}",
               r.end - r.begin, r.features.defined() ? "B" : "D", r.weight.scalar_type(),
               r.weight.sizes(), r.grad.scalar_type(), r.grad.sizes());
  MYRIAD_CHECK(
      !r.features.defined() ||
          (storable(r.features) && r.features.dim() == 2 && r.features.size(1) == r.weight.size(1)),
      "the CPU row update's features must be contiguous float32 or bfloat16 [B, {}] on the CPU, "
      "got {} {}",
      r.weight.size(1), r.features.scalar_type(), r.features.sizes());
  MYRIAD_CHECK(!r.features.defined() || r.features.scalar_type() == torch::kFloat32 ||
                   cpu_pair_products(r.grad.scalar_type()),
               "bfloat16 features take the CPU's bf16 pair products: a bfloat16 logits' gradient "
               "on a CPU with AVX512-BF16, got a {} gradient{}",
               r.grad.scalar_type(), cpu_has_bf16_products() ? "" : " on a CPU without them");
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
                           store_rounded(b + k, bk);
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
                               store_rounded(m + k, mk);
                               store_rounded(v + k, vk);
                             }
                           });
      });
    });
  });
}

}  // namespace myriad
