#include "myriad/model/vit.h"

#include <torch/version.h>

#include <cmath>

#include "myriad/model/batch_norm.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/hash_random.h"

namespace myriad {

std::optional<VitConfig> vit_config(const std::string& name) {
  struct Row {
    const char* name;
    int64_t dim, depth;
    double drop_path, mask_ratio;
  };
  // arcface_torch's table (vit_l is its vit_l_dp005_mask_005).
  static constexpr Row kRows[] = {{"vit_t", 256, 12, 0.1, 0.1},
                                  {"vit_s", 512, 12, 0.1, 0.1},
                                  {"vit_b", 512, 24, 0.1, 0.1},
                                  {"vit_l", 768, 24, 0.05, 0.05},
                                  {"vit_h", 1024, 48, 0.1, 0.0}};
  for (const Row& row : kRows) {
    if (name != row.name) continue;
    VitConfig c;
    c.dim = row.dim;
    c.depth = row.depth;
    c.drop_path = row.drop_path;
    c.mask_ratio = row.mask_ratio;
    return c;
  }
  return std::nullopt;
}

namespace {

// Seeds of the two keyed streams, mixed with the run's seed.
constexpr uint64_t kMaskStream = 0x6d61736b;      // "mask"
constexpr uint64_t kDropPathStream = 0x64726f70;  // "drop"

torch::nn::Linear linear(int64_t in, int64_t out, bool bias = true) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(1e-5));
}

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads) : heads_(heads) {
    qkv_ = register_module("qkv", linear(dim, 3 * dim, false));
    proj_ = register_module("proj", linear(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0), tokens = x.size(1), dim = x.size(2);
    const torch::Tensor qkv =
        qkv_(x).reshape({batch, tokens, 3, heads_, dim / heads_}).permute({2, 0, 3, 1, 4});
    torch::Tensor out;
    {
      // arcface_torch computes the attention in float32 whatever the autocast precision.
      NoAutocast no_autocast;
      const torch::Tensor q = qkv[0].to(torch::kFloat32);
      const torch::Tensor k = qkv[1].to(torch::kFloat32);
      const torch::Tensor v = qkv[2].to(torch::kFloat32);
#if TORCH_VERSION_MAJOR >= 2
      // Scaled by head_dim^-0.5, its default.
      out = at::scaled_dot_product_attention(q, k, v);
#else
      const double scale = 1.0 / std::sqrt(static_cast<double>(dim / heads_));
      out = torch::softmax(torch::matmul(q, k.transpose(-2, -1)).mul_(scale), -1).matmul(v);
#endif
    }
    return proj_(out.transpose(1, 2).reshape({batch, tokens, dim}));
  }

  // [N, T, dim] -> [N, T, dim]; the scale is folded into the queries' weights, `norm` (the
  // LayerNorm's affine part before) into all three.
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name,
                      const onnx_layers::InputAffine& norm) const {
    namespace layers = onnx_layers;
    const int64_t dim = qkv_->weight.size(1), head = dim / heads_;
    const torch::Tensor w = qkv_->weight.view({3, dim, dim});
    const auto heads = [&](const torch::Tensor& weight, const char* which,
                           std::vector<int64_t> perm) {
      const std::string n = name + "." + which;
      const std::string y = layers::linear_tokens(g, x, weight, {}, n, &norm);
      return g.node("Transpose", n + ".heads", {layers::reshape(g, y, {-1, heads_, head}, n + ".split")},
                    {{"perm", std::move(perm)}});
    };
    const std::string q = heads(w[0] / std::sqrt(static_cast<double>(head)), "q", {0, 2, 1, 3});
    const std::string k = heads(w[1], "k", {0, 2, 3, 1});
    const std::string v = heads(w[2], "v", {0, 2, 1, 3});
    const std::string scores = g.node(
        "Softmax", name + ".softmax", {g.node("MatMul", name + ".scores", {q, k})}, {{"axis", int64_t{-1}}});
    std::string out = g.node("MatMul", name + ".mix", {scores, v});
    out = g.node("Transpose", name + ".merge", {out}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    out = layers::reshape(g, out, {-1, dim}, name + ".concat");
    return layers::linear_tokens(g, out, proj_->weight, proj_->bias, name + ".proj");
  }

 private:
  int64_t heads_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t dim, int64_t hidden) {
    fc1_ = register_module("fc1", linear(dim, hidden));
    fc2_ = register_module("fc2", linear(hidden, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2_(torch::hardtanh(fc1_(x), 0.0, 6.0)); }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name,
                      const onnx_layers::InputAffine& norm) const {
    namespace layers = onnx_layers;
    const std::string h =
        layers::linear_tokens(g, x, fc1_->weight, fc1_->bias, name + ".fc1", &norm);
    // ReLU6 as relu(h) - relu(h - 6): OpenCV 4.6 reads Clip only with the bounds as attributes,
    // which opset 11 replaced by inputs.
    const std::string shifted = g.node(
        "Add", name + ".minus6", {h, g.constant(name + ".minus6", torch::full({1}, -6.0f))});
    const std::string relu6 = g.node("Sub", name + ".relu6",
                                     {g.node("Relu", name + ".relu", {h}),
                                      g.node("Relu", name + ".relu_above6", {shifted})});
    return layers::linear_tokens(g, relu6, fc2_->weight, fc2_->bias, name + ".fc2");
  }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Mlp);

class VitBlockImpl : public torch::nn::Module {
 public:
  VitBlockImpl(int64_t dim, int64_t heads, int64_t mlp_ratio) {
    norm1_ = register_module("norm1", layer_norm(dim));
    norm2_ = register_module("norm2", layer_norm(dim));
    attn_ = register_module("attn", Attention(dim, heads));
    mlp_ = register_module("mlp", Mlp(dim, dim * mlp_ratio));
  }
  // `drop(branch, k)` applies drop path to residual branch k (0 attention, 1 MLP).
  template <class Drop>
  torch::Tensor forward(const torch::Tensor& x, const Drop& drop) {
    const torch::Tensor y = x + drop(attn_(norm1_(x)), 0);
    return y + drop(mlp_(norm2_(y)), 1);
  }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const {
    namespace layers = onnx_layers;
    layers::InputAffine affine;
    const std::string a = attn_->to_onnx(
        g, layers::layer_norm(g, x, *norm1_, name + ".norm1", &affine), name + ".attn", affine);
    const std::string y = g.node("Add", name + ".add1", {x, a});
    const std::string m = mlp_->to_onnx(
        g, layers::layer_norm(g, y, *norm2_, name + ".norm2", &affine), name + ".mlp", affine);
    return g.node("Add", name + ".add2", {y, m});
  }

 private:
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  Attention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(VitBlock);

}  // namespace

Vit::Vit(const BackboneOptions& options, const VitConfig& config)
    : config_(config), seed_(options.seed) {
  const InputShape& in = options.input;
  MYRIAD_CHECK_COLLECTIVE(config.dim % config.heads == 0, "a ViT of width {} cannot have {} heads",
                          config.dim, config.heads);
  if (in.height < config.patch || in.width < config.patch) {
    throw UsageError(str_format("{} needs inputs of at least {}x{} pixels, got {}x{}", options.name,
                                config.patch, config.patch, in.height, in.width));
  }
  const int64_t rows = in.height / config.patch, columns = in.width / config.patch;
  tokens_ = rows * columns;
  const int64_t dim = config.dim;
  pos_embed_ = register_parameter("pos_embed", torch::zeros({1, tokens_, dim}));
  mask_token_ = register_parameter("mask_token", torch::zeros({1, 1, dim}));
  auto patch_embed = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  proj_ = patch_embed->register_module(
      "proj", torch::nn::Conv2d(
                  torch::nn::Conv2dOptions(in.channels, dim, config.patch).stride(config.patch)));
  add_block("patch_embed", {"pos_embed", "patch_embed"});
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) {
    blocks_->push_back(VitBlock(dim, config.heads, config.mlp_ratio));
    add_block("blocks." + std::to_string(i), {"blocks." + std::to_string(i)});
  }
  norm_ = register_module("norm", layer_norm(dim));
  feature_ = register_module("feature", torch::nn::Sequential());
  torch::nn::Linear reduce = linear(tokens_ * dim, dim, false);
  torch::nn::Linear embed = linear(dim, options.embedding_size, false);
  feature_->push_back(reduce);
  feature_->push_back(BatchNorm(dim, 2e-5));
  feature_->push_back(embed);
  feature_->push_back(BatchNorm(options.embedding_size, 2e-5));
  add_block("head", {"mask_token", "norm", "feature"});
  add_multiply_adds(tokens_ * proj_->weight.numel() +
                    config.depth * tokens_ * (4 + 2 * config.mlp_ratio) * dim * dim +
                    config.depth * 2 * tokens_ * tokens_ * dim + reduce->weight.numel() +
                    embed->weight.numel());

  // arcface_torch's initialisation: normal(0, 0.02) for the embeddings and linear weights, zero
  // biases, unit LayerNorms.
  torch::NoGradGuard no_grad;
  pos_embed_.normal_(0.0, 0.02);
  mask_token_.normal_(0.0, 0.02);
  for (auto& module : modules(false)) {
    if (auto* l = module->as<torch::nn::Linear>()) {
      l->weight.normal_(0.0, 0.02);
      if (l->bias.defined()) l->bias.zero_();
    }
  }
}

std::string Vit::to_onnx(OnnxGraph& g, const std::string& x) const {
  namespace layers = onnx_layers;
  const int64_t dim = config_.dim;
  std::string y = layers::conv(g, x, *proj_, "patch_embed.proj");
  y = layers::reshape(g, y, {dim, tokens_}, "patch_embed.flatten");
  y = g.node("Transpose", "patch_embed.tokens", {y}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
  // [T, dim]: OpenCV 4.6 broadcasts a constant over the batch only without a leading 1.
  y = g.node("Add", "pos_embed", {y, g.constant("pos_embed", pos_embed_[0])});
  const auto blocks = blocks_->children();
  for (size_t i = 0; i < blocks.size(); ++i)
    y = blocks[i]->as<VitBlockImpl>()->to_onnx(g, y, "blocks." + std::to_string(i));
  layers::InputAffine affine;
  y = layers::layer_norm(g, y, *norm_, "norm", &affine);
  y = layers::reshape(g, y, {tokens_ * dim}, "feature.flatten");
  // The affine part of `norm`, per token-major feature, folded into the first linear layer.
  affine = {affine.scale.repeat({tokens_}), affine.shift.repeat({tokens_})};
  const auto head = feature_->children();
  y = layers::linear(g, y, *head[0]->as<torch::nn::LinearImpl>(), "feature.0",
                     head[1]->as<BatchNormImpl>(), &affine);
  return layers::linear(g, y, *head[2]->as<torch::nn::LinearImpl>(), "feature.2",
                        head[3]->as<BatchNormImpl>());
}

Activations Vit::forward_block(int64_t block, Activations in) {
  const bool random = is_training() && in.keys.defined();
  if (block == 0) {
    torch::Tensor x = proj_(in.x).flatten(2).transpose(1, 2) + pos_embed_;
    if (random && config_.mask_ratio > 0) {
      // Each sample keeps a random subset of its tokens, drawn from its key: ties cannot happen,
      // since the token index breaks them below the hash's resolution (2^-24).
      const int64_t keep = static_cast<int64_t>(tokens_ * (1.0 - config_.mask_ratio));
      const torch::Tensor t = torch::arange(tokens_, in.keys.options());
      const torch::Tensor noise =
          hash_uniform(in.keys.view({-1, 1}) * tokens_ + t, seed_ ^ kMaskStream)
              .to(torch::kFloat64)
              .add_(t.to(torch::kFloat64) * std::ldexp(1.0, -32));
      const torch::Tensor shuffle = noise.argsort(/*dim=*/int64_t{1});
      in.restore = shuffle.argsort(/*dim=*/int64_t{1});
      x = x.gather(1, shuffle.narrow(1, 0, keep).unsqueeze(-1).expand({-1, -1, x.size(2)}));
    }
    in.x = x;
    return in;
  }
  if (block + 1 == num_blocks()) {
    torch::Tensor x = norm_(in.x.to(torch::kFloat32));
    if (in.restore.defined()) {
      const torch::Tensor filled = torch::cat(
          {x, mask_token_.expand({x.size(0), tokens_ - x.size(1), -1}).to(x.scalar_type())}, 1);
      x = filled.gather(1, in.restore.unsqueeze(-1).expand({-1, -1, x.size(2)}));
    }
    in.x = feature_->forward(x.reshape({x.size(0), -1}));
    return in;
  }
  const int64_t i = block - 1;
  // Drop path: rates rise linearly from 0 (first block) to config_.drop_path (last).
  const double rate =
      config_.depth > 1 ? config_.drop_path * static_cast<double>(i) / (config_.depth - 1) : 0.0;
  const auto drop = [&](const torch::Tensor& branch, int64_t k) {
    if (!random || rate <= 0.0) return branch;
    const torch::Tensor u =
        hash_uniform(in.keys * (2 * config_.depth) + (2 * i + k), seed_ ^ kDropPathStream);
    const torch::Tensor keep = u.ge(rate).to(branch.scalar_type()).div_(1.0 - rate);
    return branch * keep.view({-1, 1, 1});
  };
  in.x = blocks_[i]->as<VitBlockImpl>()->forward(in.x, drop);
  return in;
}

}  // namespace myriad
