#include "myriad/model/roofline.h"

#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

namespace myriad {

namespace {

using torch::autograd::InputMetadata;
using torch::autograd::Node;

// A tensor's shape and element size as autograd recorded them.
struct Shape {
  std::vector<int64_t> sizes;
  double element_bytes = 0;

  double numel() const {
    double n = 1;
    for (int64_t s : sizes) n *= static_cast<double>(s);
    return n;
  }
  double bytes() const { return numel() * element_bytes; }
};

Shape shape_of(const InputMetadata& meta) {
#if TORCH_VERSION_MAJOR >= 2
  const c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(meta.shape_as_dim_vector());
#else
  // LibTorch 1.x keeps the shape private; a zero tensor of it is the public way to read it.
  const torch::Tensor zeros = meta.zeros_like();
  const c10::IntArrayRef sizes = zeros.sizes();
#endif
  return {sizes.vec(), static_cast<double>(meta.options().dtype().itemsize())};
}

// The shapes of the forward pass's outputs of `node` (the gradients it receives).
std::vector<Shape> outputs_of(const Node& node) {
  std::vector<Shape> shapes;
  for (uint32_t i = 0; i < node.num_inputs(); ++i)
    shapes.push_back(shape_of(node.input_metadata(i)));
  return shapes;
}

// The shapes of its forward inputs that require gradients, in argument order; nothing for the
// others.
std::vector<std::optional<Shape>> inputs_of(const Node& node) {
  std::vector<std::optional<Shape>> shapes;
  for (const torch::autograd::Edge& edge : node.next_edges()) {
    if (edge.is_valid()) {
      shapes.push_back(shape_of(edge.function->input_metadata(edge.input_nr)));
    } else {
      shapes.emplace_back();
    }
  }
  return shapes;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// Operations that only reinterpret their input's memory: no bytes of their own.
bool is_view(const std::string& op) {
  for (const char* prefix :
       {"View", "UnsafeView", "Reshape", "TBackward", "Transpose", "Permute", "Expand", "Squeeze",
        "Unsqueeze", "Select", "Slice", "AsStrided", "Alias", "Unbind", "Split"}) {
    if (starts_with(op, prefix)) return true;
  }
  return false;
}

// Leaves and the engine's own nodes, which are no operation of the forward pass.
bool is_bookkeeping(const std::string& op) {
  return contains(op, "AccumulateGrad") || contains(op, "GraphRoot") || contains(op, "CopySlices");
}

LayerKind kind_of(const std::string& op) {
  if (contains(op, "Convolution") || contains(op, "Conv2D") || contains(op, "ConvDepthwise"))
    return LayerKind::kConvolution;
  if (contains(op, "BatchNorm") || contains(op, "Prelu") || contains(op, "PReLU"))
    return LayerKind::kBatchNormPrelu;
  if (starts_with(op, "AddBackward")) return LayerKind::kAdd;
  if (starts_with(op, "ToCopyBackward")) return LayerKind::kCast;
  for (const char* prefix : {"MmBackward", "AddmmBackward", "BmmBackward", "BaddbmmBackward",
                             "LinearBackward", "ScaledDotProduct"}) {
    if (starts_with(op, prefix)) return LayerKind::kGemm;
  }
  return LayerKind::kOther;
}

double sum_bytes(const std::vector<Shape>& outputs,
                 const std::vector<std::optional<Shape>>& inputs) {
  double bytes = 0;
  for (const Shape& s : outputs) bytes += s.bytes();
  for (const auto& s : inputs) bytes += s ? s->bytes() : 0.0;
  return bytes;
}

// Multiply-adds of one forward pass of a matrix-product operation.
double multiply_adds(const std::string& op, LayerKind kind, const Shape& out,
                     const std::vector<std::optional<Shape>>& inputs) {
  if (kind == LayerKind::kConvolution) {
    // Every output element is a dot product over the weight's fan-in.
    const auto& weight = inputs.size() > 1 ? inputs[1] : std::nullopt;
    if (!weight || weight->sizes.empty()) return 0;
    return out.numel() * weight->numel() / static_cast<double>(weight->sizes[0]);
  }
  if (starts_with(op, "ScaledDotProduct")) {
    // Q K^T and P V: each output element is 2 dot products over the keys' length.
    const auto& key = inputs.size() > 1 ? inputs[1] : std::nullopt;
    return key && key->sizes.size() >= 2 ? 2.0 * out.numel() * key->sizes[key->sizes.size() - 2]
                                         : 0.0;
  }
  // [.., M, K] x [.., K, N], the last two arguments (addmm's first is the bias).
  if (inputs.size() < 2) return 0;
  const auto& a = inputs[inputs.size() - 2];
  const auto& b = inputs[inputs.size() - 1];
  double k = 0;
  if (a && !a->sizes.empty()) {
    k = static_cast<double>(a->sizes.back());
  } else if (b && b->sizes.size() >= 2) {
    k = static_cast<double>(b->sizes[b->sizes.size() - 2]);
  }
  return out.numel() * k;
}

LayerCost cost_of(const Node& node) {
  LayerCost cost;
  cost.op = node.name();
  cost.kind = kind_of(cost.op);
  const std::vector<Shape> outputs = outputs_of(node);
  const std::vector<std::optional<Shape>> inputs = inputs_of(node);
  switch (cost.kind) {
    case LayerKind::kConvolution:
    case LayerKind::kGemm:
      cost.flops =
          outputs.empty() ? 0.0 : 6.0 * multiply_adds(cost.op, cost.kind, outputs[0], inputs);
      cost.bytes = 3.0 * sum_bytes(outputs, inputs);
      break;
    case LayerKind::kAdd:
    case LayerKind::kCast:
      cost.bytes = 2.0 * sum_bytes(outputs, inputs);
      break;
    case LayerKind::kBatchNormPrelu:
      // The output written, then read backward. An output after the first is forward_fork's
      // second use of the input, a view: only its gradient is read, in the pass that writes the
      // input's.
      for (size_t i = 0; i < outputs.size(); ++i)
        cost.bytes += (i == 0 ? 2.0 : 1.0) * outputs[i].bytes();
      for (size_t i = 0; i < inputs.size(); ++i)
        cost.bytes += (i == 0 ? 3.0 : 1.0) * (inputs[i] ? inputs[i]->bytes() : 0.0);
      break;
    case LayerKind::kOther:
      cost.bytes = 2.0 * sum_bytes(outputs, {}) + 3.0 * sum_bytes({}, inputs);
      break;
  }
  return cost;
}

}  // namespace

const char* to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kConvolution:
      return "convolution";
    case LayerKind::kBatchNormPrelu:
      return "batch norm + PReLU";
    case LayerKind::kAdd:
      return "add";
    case LayerKind::kGemm:
      return "GEMM";
    case LayerKind::kCast:
      return "cast";
    case LayerKind::kOther:
      return "other";
  }
  return "other";
}

const std::vector<LayerKind>& layer_kinds() {
  static const std::vector<LayerKind> kinds = {LayerKind::kConvolution, LayerKind::kBatchNormPrelu,
                                               LayerKind::kAdd,         LayerKind::kGemm,
                                               LayerKind::kCast,        LayerKind::kOther};
  return kinds;
}

std::vector<LayerCost> layer_census(const torch::Tensor& output) {
  std::vector<LayerCost> census;
  if (!output.grad_fn()) return census;
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> pending = {output.grad_fn()};
  seen.insert(pending.back().get());
  while (!pending.empty()) {
    const std::shared_ptr<Node> node = pending.back();
    pending.pop_back();
    const std::string op = node->name();
    if (!is_bookkeeping(op) && !is_view(op)) census.push_back(cost_of(*node));
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.is_valid() && seen.insert(edge.function.get()).second)
        pending.push_back(edge.function);
    }
  }
  return census;
}

std::vector<KindFloor> roofline(const std::vector<LayerCost>& census, const Ceilings& ceilings) {
  std::vector<KindFloor> rows;
  for (LayerKind kind : layer_kinds()) {
    KindFloor row;
    row.kind = kind;
    for (const LayerCost& layer : census) {
      if (layer.kind != kind) continue;
      const double compute = layer.flops / (ceilings.gemm_tflops * 1e12);
      const double memory = layer.bytes / ceilings.memory_bandwidth;
      ++row.layers;
      row.flops += layer.flops;
      row.bytes += layer.bytes;
      row.compute_seconds += compute;
      row.memory_seconds += memory;
      row.floor_seconds += std::max(compute, memory);
    }
    rows.push_back(row);
  }
  return rows;
}

double floor_seconds(const std::vector<KindFloor>& kinds) {
  double total = 0;
  for (const KindFloor& k : kinds) total += k.floor_seconds;
  return total;
}

}  // namespace myriad
