#pragma once

#include <optional>
#include <string>

#include "myriad/model/backbone.h"

namespace myriad {

// One of insightface arcface_torch's face ViTs.
struct VitConfig {
  int64_t dim = 256;
  int64_t depth = 12;
  int64_t heads = 8;
  int64_t mlp_ratio = 4;
  double drop_path = 0.1;   // the last block's rate; rates rise linearly from 0 over the depth
  double mask_ratio = 0.1;  // of the 144 tokens, dropped at random in training
  int64_t patch = 9;
};

// vit_t (256, 12, 0.1, 0.1), vit_s (512, 12, 0.1, 0.1), vit_b (512, 24, 0.1, 0.1), vit_l (768, 24,
// 0.05, 0.05: arcface_torch's vit_l_dp005_mask_005), vit_h (1024, 48, 0.1, 0): dim, depth,
// drop-path rate and mask ratio; 8 heads and an MLP 4x wide. Nothing for any other name.
std::optional<VitConfig> vit_config(const std::string& name);

// arcface_torch's VisionTransformer under its names: pos_embed [1, T, dim] and mask_token
// [1, 1, dim]; patch_embed.proj, a conv of the patch size and stride (3x112x112 in 9x9 patches:
// 12x12 = 144 tokens, the last 4 rows and columns unused), no class token; `blocks` of
// x + attn(norm1(x)) then x + mlp(norm2(x)) (LayerNorm eps 1e-5; qkv one Linear without bias,
// scale head_dim^-0.5, the attention itself in float32 even under autocast, fused where LibTorch
// has scaled_dot_product_attention; MLP fc1 - ReLU6 - fc2; drop path on both branches); `norm`;
// then `feature`: Linear(T dim -> dim, no bias), BN1d (eps 2e-5), Linear(dim -> D, no bias), BN1d
// (eps 2e-5) over the token-major flatten.
//
// In training with a mask ratio r > 0, each sample keeps int(T (1 - r)) of its tokens, a random
// subset in shuffled order, through the blocks; after `norm`, mask_token fills the removed places
// and the tokens return to their order. Masking and drop path draw from the samples' keys
// (Activations::keys), so W ranks compute what 1 rank computes.
//
// Blocks: the patch embedding (with masking), each transformer block, and norm with the head.
class Vit final : public Backbone {
 public:
  Vit(const BackboneOptions& options, const VitConfig& config);
  Activations forward_block(int64_t block, Activations in) override;
  std::string to_onnx(OnnxGraph& g, const std::string& x) const override;

  const VitConfig& config() const { return config_; }

 private:
  VitConfig config_;
  uint64_t seed_;
  int64_t tokens_;
  torch::Tensor pos_embed_;
  torch::Tensor mask_token_;
  torch::nn::Conv2d proj_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Sequential feature_{nullptr};
};

}  // namespace myriad
