#include "myriad/model/weight_casts.h"

#include "myriad/util/error.h"

namespace myriad {

namespace {

thread_local WeightCasts* innermost = nullptr;

// Each copy starts a multiple of 64 elements into the group's buffer: cuDNN's graph declares its
// tensors 16-byte aligned, and its kernels load weights in wide vectors.
constexpr int64_t kAlignment = 64;

// `w`'s elements in memory order, as a view; undefined where w is dense in neither layout.
torch::Tensor flat_view(const torch::Tensor& w) {
  if (w.is_contiguous()) return w.view(-1);
  if (w.dim() == 4 && w.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
    return w.permute({0, 2, 3, 1}).reshape(-1);
  }
  return {};
}

// flat_view's inverse: `flat` in the shape and layout of `like`.
torch::Tensor unflatten(const torch::Tensor& flat, const torch::Tensor& like) {
  if (like.is_contiguous()) return flat.view(like.sizes());
  return flat.view({like.size(0), like.size(2), like.size(3), like.size(1)}).permute({0, 3, 1, 2});
}

}  // namespace

WeightCasts::WeightCasts(torch::ScalarType dtype) : dtype_(dtype), outer_(innermost) {
  MYRIAD_CHECK(dtype == torch::kBFloat16 || dtype == torch::kHalf,
               "weights are cast to bfloat16 or float16, not {}", dtype);
  innermost = this;
}

WeightCasts::~WeightCasts() {
  innermost = outer_;
}

// One cat gathers the group (its backward gives each weight a view of the float32 gradient), one
// cast converts it, and split_with_sizes hands out the copies: its backward gathers their
// gradients with one cat for the one cast back.
void WeightCasts::cast(const std::vector<torch::Tensor>& weights) {
  std::vector<torch::Tensor> members, flats;
  std::vector<int64_t> sizes;
  for (const torch::Tensor& w : weights) {
    if (w.scalar_type() != torch::kFloat32 || w.numel() % kAlignment != 0) continue;
    torch::Tensor flat = flat_view(w);
    if (!flat.defined()) continue;
    members.push_back(w);
    flats.push_back(std::move(flat));
    sizes.push_back(w.numel());
  }
  if (members.empty()) return;
  const std::vector<torch::Tensor> parts = torch::cat(flats).to(dtype_).split_with_sizes(sizes);
  for (size_t i = 0; i < members.size(); ++i) {
    copies_[members[i].unsafeGetTensorImpl()] = unflatten(parts[i], members[i]);
  }
}

torch::Tensor WeightCasts::copy_of(const torch::Tensor& weight, torch::ScalarType dtype) {
  for (const WeightCasts* c = innermost; c != nullptr; c = c->outer_) {
    if (c->dtype_ != dtype) continue;
    const auto it = c->copies_.find(weight.unsafeGetTensorImpl());
    if (it != c->copies_.end()) return it->second;
  }
  return {};
}

}  // namespace myriad
