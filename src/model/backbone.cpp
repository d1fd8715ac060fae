#include "myriad/model/backbone.h"

#include <torch/autograd.h>

#include <map>
#include <optional>
#include <sstream>

#include "myriad/model/iresnet.h"
#include "myriad/model/mbf.h"
#include "myriad/model/mobilefacenet.h"
#include "myriad/model/small_cnn.h"
#include "myriad/model/vit.h"
#include "myriad/model/weight_casts.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"

namespace myriad {

InputShape parse_input_shape(const std::string& text) {
  InputShape shape;
  char x1 = 0, x2 = 0;
  std::istringstream in(text);
  if (!(in >> shape.channels >> x1 >> shape.height >> x2 >> shape.width) || x1 != 'x' ||
      x2 != 'x' || in.peek() != EOF || shape.channels <= 0 || shape.height <= 0 ||
      shape.width <= 0) {
    throw UsageError(
        str_format("'{}' is not an input shape CxHxW (e.g. 3x112x112 or 1x28x28)", text));
  }
  MYRIAD_CHECK_COLLECTIVE(shape.channels == 1 || shape.channels == 3,
                          "input images have 1 or 3 channels, not {}", shape.channels);
  return shape;
}

namespace {

thread_local bool recomputing = false;

// A block that keeps only its input in forward and runs again in backward (reentrant, as
// torch.utils.checkpoint): the recomputation's own backward fills the parameters' gradients and
// gives the input's. Randomness is keyed (Activations::keys), so the second pass draws what the
// first drew, and autocast is restored to what it was.
class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  // Only `in.x` is an input of the graph: the keys and the token order travel as saved data
  // (LibTorch's autograd functions take no undefined tensors as inputs).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               Backbone* net, int64_t block, const Activations* in) {
    const std::optional<torch::ScalarType> autocast = active_autocast(x.device().type());
    ctx->saved_data["net"] = reinterpret_cast<int64_t>(net);
    ctx->saved_data["block"] = block;
    ctx->saved_data["autocast"] = autocast ? static_cast<int64_t>(*autocast) : int64_t{-1};
    ctx->saved_data["keys"] = in->keys;
    ctx->saved_data["restore"] = in->restore;
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return net->forward_block(block, {x, in->keys, in->restore}).x;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* net = reinterpret_cast<Backbone*>(ctx->saved_data["net"].toInt());
    const torch::Tensor saved = ctx->get_saved_variables()[0];
    const torch::Tensor x = saved.detach().requires_grad_(saved.requires_grad());
    const int64_t autocast = ctx->saved_data["autocast"].toInt();
    torch::Tensor y;
    {
      torch::AutoGradMode grad_mode(true);
      const AutocastGuard guard(
          x.device(),
          autocast >= 0 ? std::optional<torch::ScalarType>(static_cast<torch::ScalarType>(autocast))
                        : std::nullopt);
      recomputing = true;
      try {
        y = net->forward_block(
                   ctx->saved_data["block"].toInt(),
                   {x, ctx->saved_data["keys"].toTensor(), ctx->saved_data["restore"].toTensor()})
                .x;
      } catch (...) {
        recomputing = false;
        throw;
      }
      recomputing = false;
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.requires_grad() ? x.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

bool recomputing_activations() {
  return recomputing;
}

SummedMap summed_input(const Activations& in) {
  return in.summed.y.is_same(in.x) ? in.summed : SummedMap{in.x};
}

torch::Tensor Backbone::forward(const torch::Tensor& images, const torch::Tensor& keys) {
  return forward_blocks({images, keys, torch::Tensor()}, 0, num_blocks()).x;
}

Activations Backbone::forward_blocks(Activations in, int64_t begin, int64_t end) {
  MYRIAD_CHECK(0 <= begin && begin <= end && end <= num_blocks(),
               "blocks [{}, {}) of a backbone of {}", begin, end, num_blocks());
  const bool training = is_training() && torch::GradMode::is_enabled();
  const auto checkpointed = [&](int64_t b) { return training && checkpointed_in_training(b); };
  const std::optional<torch::ScalarType> autocast = active_autocast(in.x.device().type());
  std::optional<WeightCasts> casts;
  std::vector<std::pair<int64_t, int64_t>> groups;
  if (training && autocast && grouped_weight_casts_) {
    casts.emplace(*autocast);
    groups = weight_cast_groups(begin, end);
  }
  auto group = groups.begin();
  for (int64_t b = begin; b < end; ++b) {
    if (checkpointed(b)) {
      in.x = CheckpointedBlock::apply(in.x, this, b, &in);
      continue;
    }
    // Cast right before the group's first block: autograd's engine runs a node once nothing made
    // after it is ready, so the group's gradients come back as soon as its blocks' backward ends.
    if (group != groups.end() && group->first == b) casts->cast(convolution_weights(*group++));
    in.sum_output = output_sums_ && b + 1 < end && !checkpointed(b + 1);
    in = forward_block(b, std::move(in));
  }
  return in;
}

// The first block's input is the images and the last one's output the embedding: keeping those
// costs nothing extra.
bool Backbone::checkpointed_in_training(int64_t b) const {
  return checkpointing_ && b > 0 && b + 1 < num_blocks();
}

std::vector<std::pair<int64_t, int64_t>> Backbone::weight_cast_groups(int64_t begin,
                                                                      int64_t end) const {
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (int64_t b = begin; b < end; ++b) {
    if (checkpointed_in_training(b)) continue;
    if (groups.empty() || groups.back().second != b) {
      groups.emplace_back(b, b + 1);
    } else {
      ++groups.back().second;
    }
  }
  return groups;
}

std::vector<torch::Tensor> Backbone::convolution_weights(std::pair<int64_t, int64_t> group) const {
  std::vector<torch::Tensor> weights;
  for (int64_t b = group.first; b < group.second; ++b) {
    for (torch::Tensor& w : convolution_weights(b)) weights.push_back(std::move(w));
  }
  return weights;
}

std::string Backbone::weight_casts_note() const {
  if (!grouped_weight_casts_) return "";
  int64_t groups = 0;
  for (const auto& group : weight_cast_groups(0, num_blocks())) {
    if (!convolution_weights(group).empty()) ++groups;
  }
  if (groups == 0) return "";
  return str_format("convolution weights cast in {} group{}", groups, groups == 1 ? "" : "s");
}

void Backbone::add_block(std::string name, std::vector<std::string> prefixes) {
  blocks_.push_back({std::move(name), std::move(prefixes)});
}

bool Backbone::in_block(const std::string& name, int64_t block) const {
  for (const std::string& p : blocks_.at(block).prefixes) {
    if (name == p ||
        (name.size() > p.size() && name.compare(0, p.size(), p) == 0 && name[p.size()] == '.')) {
      return true;
    }
  }
  return false;
}

int64_t Backbone::block_of(const std::string& name) const {
  for (int64_t b = 0; b < num_blocks(); ++b) {
    if (in_block(name, b)) return b;
  }
  MYRIAD_THROW("state-dict entry '{}' belongs to no block of the backbone", name);
}

StateDict Backbone::state_dict() {
  StateDict state;
  // named_modules lists modules depth first in registration order, as PyTorch's state_dict
  // visits them.
  for (const auto& item : named_modules("", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      state.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      state.emplace_back(prefix + b.key(), b.value());
  }
  return state;
}

namespace {

// "a, b, c and 4 more"
std::string listing(const std::vector<std::string>& items) {
  constexpr size_t kShown = 4;
  std::string text;
  for (size_t i = 0; i < std::min(items.size(), kShown); ++i)
    text += (i == 0 ? "" : ", ") + items[i];
  if (items.size() > kShown) text += str_format(" and {} more", items.size() - kShown);
  return text;
}

}  // namespace

void Backbone::load_state_dict(const StateDict& source, const std::string& what) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, tensor] : source) by_name[name] = &tensor;
  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> copies;
  std::vector<std::string> missing, reshaped;
  for (auto& [name, tensor] : state_dict()) {
    auto it = by_name.find(name);
    if (it == by_name.end() && !legacy_name(name).empty()) it = by_name.find(legacy_name(name));
    if (it == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    if (it->second->sizes() != tensor.sizes()) {
      reshaped.push_back(
          str_format("{}: {} there, {} here", name, it->second->sizes(), tensor.sizes()));
    }
    copies.emplace_back(tensor, it->second);
    by_name.erase(it);
  }
  std::vector<std::string> extra;
  for (const auto& [name, tensor] : by_name) extra.push_back(name);
  std::vector<std::string> problems;
  if (!missing.empty())
    problems.push_back(str_format("{} missing ({})", missing.size(), listing(missing)));
  if (!extra.empty())
    problems.push_back(str_format("{} unexpected ({})", extra.size(), listing(extra)));
  if (!reshaped.empty())
    problems.push_back(str_format("{} of another shape ({})", reshaped.size(), listing(reshaped)));
  MYRIAD_CHECK_COLLECTIVE(problems.empty(), "{} does not fit this backbone: {}", what,
                          listing(problems));
  torch::NoGradGuard no_grad;
  for (auto& [to, from] : copies) to.copy_(*from);
}

void Backbone::set_channels_last(bool on) {
  torch::NoGradGuard no_grad;
  const auto format = on ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
  for (torch::Tensor& p : parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(format));
  }
  channels_last_ = on;
}

torch::Tensor Backbone::in_layout(const torch::Tensor& images) const {
  return channels_last_ && images.dim() == 4 ? images.contiguous(torch::MemoryFormat::ChannelsLast)
                                             : images;
}

namespace {

// insightface's names of myriad's IResNets, and their blocks per stage.
const std::map<std::string, std::pair<std::string, std::vector<int64_t>>>& iresnets() {
  static const std::map<std::string, std::pair<std::string, std::vector<int64_t>>> nets = {
      {"iresnet18", {"r18", {2, 2, 2, 2}}},
      {"iresnet34", {"r34", {3, 4, 6, 3}}},
      {"iresnet50", {"r50", {3, 4, 14, 3}}},
      {"iresnet100", {"r100", {3, 13, 30, 3}}},
      {"iresnet200", {"r200", {6, 26, 60, 6}}}};
  return nets;
}

}  // namespace

const std::vector<std::string>& backbone_names() {
  static const std::vector<std::string> names = {
      "r18",       "r34",       "r50",        "r100",       "r200",          "mbf",
      "vit_t",     "vit_s",     "vit_b",      "vit_l",      "vit_h",         "iresnet18",
      "iresnet34", "iresnet50", "iresnet100", "iresnet200", "mobilefacenet", "smallcnn"};
  return names;
}

std::string insightface_name(const std::string& name) {
  const auto it = iresnets().find(name);
  return it == iresnets().end() ? name : it->second.first;
}

std::shared_ptr<Backbone> make_backbone(const BackboneOptions& options) {
  MYRIAD_CHECK_COLLECTIVE(options.embedding_size > 0, "the embedding size must be positive");
  for (const auto& [myriad_name, net] : iresnets()) {
    if (options.name == myriad_name || options.name == net.first)
      return std::make_shared<IResNet>(options, net.second);
  }
  if (options.name == "mbf") return std::make_shared<Mbf>(options);
  if (const std::optional<VitConfig> vit = vit_config(options.name); vit.has_value())
    return std::make_shared<Vit>(options, *vit);
  if (options.name == "mobilefacenet") return std::make_shared<MobileFaceNet>(options);
  if (options.name == "smallcnn") return std::make_shared<SmallCnn>(options);
  std::string known;
  for (const std::string& n : backbone_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError(str_format("unknown backbone '{}' ({})", options.name, known));
}

}  // namespace myriad
