#include "myriad/model/onnx_graph.h"

#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/protobuf_writer.h"

namespace myriad {

namespace {

// Field numbers and enumerators of onnx.proto.
namespace field {
constexpr int kModelIrVersion = 1, kModelProducerName = 2, kModelProducerVersion = 3,
              kModelGraph = 7, kModelOpsetImport = 8;
constexpr int kOpsetVersion = 2;
constexpr int kGraphNode = 1, kGraphName = 2, kGraphInitializer = 5, kGraphInput = 11,
              kGraphOutput = 12;
constexpr int kNodeInput = 1, kNodeOutput = 2, kNodeName = 3, kNodeOpType = 4, kNodeAttribute = 5;
constexpr int kAttributeName = 1, kAttributeF = 2, kAttributeI = 3, kAttributeInts = 8,
              kAttributeType = 20;
constexpr int kTensorDims = 1, kTensorDataType = 2, kTensorName = 8, kTensorRawData = 9,
              kTensorExternalData = 13, kTensorDataLocation = 14;
constexpr int kEntryKey = 1, kEntryValue = 2;
constexpr int kValueName = 1, kValueType = 2, kTypeTensor = 1, kTensorTypeElem = 1,
              kTensorTypeShape = 2, kShapeDim = 1, kDimValue = 1, kDimParam = 2;
}  // namespace field
constexpr int64_t kAttributeFloat = 1, kAttributeInt = 2, kAttributeInts = 7;
constexpr int64_t kFloat = 1, kInt64 = 7;
constexpr int64_t kExternal = 1;
// The IR version of opset 13's release (ONNX 1.8).
constexpr int64_t kIrVersion = 7;
// Initializers of at least this many bytes go to the external data when a model needs it (onnx's
// convert_model_to_external_data uses the same threshold).
constexpr int64_t kExternalMinBytes = 1024;
// Protobuf refuses messages of 2 GiB or more; this leaves room for everything but the weights.
constexpr int64_t kInlineLimit = (int64_t{1} << 31) - (int64_t{64} << 20);

ProtoMessage value_info(const std::string& name, const std::vector<int64_t>& shape) {
  ProtoMessage dims;
  ProtoMessage batch;
  batch.add_bytes(field::kDimParam, "batch");
  dims.add_message(field::kShapeDim, batch);
  for (int64_t d : shape) {
    ProtoMessage dim;
    dim.add_int(field::kDimValue, d);
    dims.add_message(field::kShapeDim, dim);
  }
  ProtoMessage tensor;
  tensor.add_int(field::kTensorTypeElem, kFloat);
  tensor.add_message(field::kTensorTypeShape, dims);
  ProtoMessage type;
  type.add_message(field::kTypeTensor, tensor);
  ProtoMessage info;
  info.add_bytes(field::kValueName, name);
  info.add_message(field::kValueType, type);
  return info;
}

ProtoMessage attribute(const OnnxAttribute& a) {
  ProtoMessage m;
  m.add_bytes(field::kAttributeName, a.name);
  if (const auto* i = std::get_if<int64_t>(&a.value)) {
    m.add_int(field::kAttributeI, *i);
    m.add_int(field::kAttributeType, kAttributeInt);
  } else if (const auto* f = std::get_if<float>(&a.value)) {
    m.add_float(field::kAttributeF, *f);
    m.add_int(field::kAttributeType, kAttributeFloat);
  } else {
    m.add_packed_ints(field::kAttributeInts, std::get<std::vector<int64_t>>(a.value));
    m.add_int(field::kAttributeType, kAttributeInts);
  }
  return m;
}

void write_bytes(std::ofstream& out, const void* data, size_t bytes) {
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

}  // namespace

OnnxGraph::OnnxGraph(std::string input_name, std::vector<int64_t> shape)
    : input_shape_(std::move(shape)) {
  input_name_ = unique(input_name);
}

std::string OnnxGraph::unique(const std::string& name) {
  std::string result = name;
  for (int k = 1; std::find(names_.begin(), names_.end(), result) != names_.end(); ++k)
    result = name + "_" + std::to_string(k);
  names_.push_back(result);
  return result;
}

std::string OnnxGraph::constant(const std::string& name, const torch::Tensor& value) {
  MYRIAD_CHECK(value.scalar_type() == torch::kFloat32 || value.scalar_type() == torch::kInt64,
               "ONNX constant '{}' must be float32 or int64, not {}", name,
               c10::toString(value.scalar_type()));
  initializers_.push_back({unique(name), value.detach().to(torch::kCPU).contiguous().clone()});
  return initializers_.back().name;
}

std::string OnnxGraph::node(const std::string& op, const std::string& name,
                            const std::vector<std::string>& inputs,
                            std::vector<OnnxAttribute> attributes) {
  const std::string output = unique(name);
  nodes_.push_back({op, output, inputs, std::move(attributes), output});
  return output;
}

void OnnxGraph::set_output(const std::string& value, const std::string& name,
                           std::vector<int64_t> shape) {
  // The producing node's output takes the graph output's name, so no Identity node is needed.
  auto producer =
      std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.output == value; });
  MYRIAD_CHECK(producer != nodes_.end(), "ONNX graph: no node computes '{}'", value);
  producer->output = unique(name);
  for (Node& n : nodes_) std::replace(n.inputs.begin(), n.inputs.end(), value, producer->output);
  output_name_ = producer->output;
  output_shape_ = std::move(shape);
}

int64_t OnnxGraph::initializer_bytes() const {
  int64_t total = 0;
  for (const Initializer& i : initializers_) total += i.value.nbytes();
  return total;
}

bool OnnxGraph::needs_external_data() const {
  return initializer_bytes() > kInlineLimit;
}

ProtoMessage OnnxGraph::graph_without_initializers() const {
  ProtoMessage graph;
  for (const Node& n : nodes_) {
    ProtoMessage node;
    for (const std::string& in : n.inputs) node.add_bytes(field::kNodeInput, in);
    node.add_bytes(field::kNodeOutput, n.output);
    node.add_bytes(field::kNodeName, n.name);
    node.add_bytes(field::kNodeOpType, n.op);
    for (const OnnxAttribute& a : n.attributes)
      node.add_message(field::kNodeAttribute, attribute(a));
    graph.add_message(field::kGraphNode, node);
  }
  graph.add_bytes(field::kGraphName, "myriad");
  graph.add_message(field::kGraphInput, value_info(input_name_, input_shape_));
  graph.add_message(field::kGraphOutput, value_info(output_name_, output_shape_));
  return graph;
}

// Each initializer: its header, then its raw bytes (inline) or their place in the data file.
// Small ones (shapes, axes) stay inline even then, as onnx's own converter keeps them: shape
// inference reads a Reshape's shape from the model and cannot follow it into external data.
OnnxGraph::InitializerHeader OnnxGraph::header_of(const Initializer& i, bool external,
                                                  const std::string& data_location,
                                                  int64_t& offset) {
  InitializerHeader h;
  ProtoMessage& t = h.message;
  t.add_packed_ints(field::kTensorDims, i.value.sizes().vec());
  t.add_int(field::kTensorDataType, i.value.scalar_type() == torch::kFloat32 ? kFloat : kInt64);
  t.add_bytes(field::kTensorName, i.name);
  const int64_t bytes = i.value.nbytes();
  h.outside = external && bytes >= kExternalMinBytes;
  if (!h.outside) {
    t.add_length_prefix(field::kTensorRawData, static_cast<uint64_t>(bytes));
    h.size = t.size() + static_cast<uint64_t>(bytes);
    return h;
  }
  const std::pair<const char*, std::string> entries[] = {{"location", data_location},
                                                         {"offset", std::to_string(offset)},
                                                         {"length", std::to_string(bytes)}};
  for (const auto& [key, value] : entries) {
    ProtoMessage entry;
    entry.add_bytes(field::kEntryKey, key);
    entry.add_bytes(field::kEntryValue, value);
    t.add_message(field::kTensorExternalData, entry);
  }
  t.add_int(field::kTensorDataLocation, kExternal);
  h.size = t.size();
  offset += bytes;
  return h;
}

namespace {

// The model's fields before its graph, whose length prefix (graph_size bytes) ends them.
ProtoMessage model_head(uint64_t graph_size) {
  ProtoMessage model;
  model.add_int(field::kModelIrVersion, kIrVersion);
  model.add_bytes(field::kModelProducerName, "myriad");
  model.add_bytes(field::kModelProducerVersion, "1");
  ProtoMessage opset;
  opset.add_int(field::kOpsetVersion, OnnxGraph::kOnnxOpset);
  model.add_message(field::kModelOpsetImport, opset);
  model.add_length_prefix(field::kModelGraph, graph_size);
  return model;
}

std::ofstream create(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MYRIAD_CHECK(out.good(), "cannot create '{}': {}", path, std::strerror(errno));
  return out;
}

void finish(std::ofstream& out, const std::string& path) {
  out.flush();
  MYRIAD_CHECK(out.good(), "cannot write '{}'", path);
}

}  // namespace

void OnnxGraph::write(const std::string& path, const std::string& data_path,
                      const std::string& data_location) const {
  MYRIAD_CHECK(!output_name_.empty(), "ONNX graph without an output");
  const bool external = needs_external_data();
  const ProtoMessage graph = graph_without_initializers();
  std::vector<InitializerHeader> headers;
  uint64_t graph_size = graph.size();
  int64_t offset = 0;
  for (const Initializer& i : initializers_) {
    headers.push_back(header_of(i, external, data_location, offset));
    graph_size += ProtoMessage::length_prefix_size(field::kGraphInitializer, headers.back().size) +
                  headers.back().size;
  }
  const ProtoMessage model = model_head(graph_size);
  std::ofstream out = create(path);
  std::ofstream data;
  if (external) data = create(data_path);
  write_bytes(out, model.bytes().data(), model.size());
  write_bytes(out, graph.bytes().data(), graph.size());
  for (size_t k = 0; k < initializers_.size(); ++k) {
    const InitializerHeader& h = headers[k];
    ProtoMessage prefix;
    prefix.add_length_prefix(field::kGraphInitializer, h.size);
    write_bytes(out, prefix.bytes().data(), prefix.size());
    write_bytes(out, h.message.bytes().data(), h.message.size());
    // Raw data is little-endian, as the tensors are on the machines myriad runs on.
    const torch::Tensor& value = initializers_[k].value;
    write_bytes(h.outside ? data : out, value.data_ptr(), value.nbytes());
  }
  finish(out, path);
  if (external) finish(data, data_path);
}

namespace onnx_layers {

namespace {

// Batch norm with running statistics as y = x * scale + shift, per channel, in float64.
std::pair<torch::Tensor, torch::Tensor> bn_affine(const BatchNormImpl& bn) {
  const torch::Tensor scale =
      bn.weight.to(torch::kFloat64) / (bn.running_var.to(torch::kFloat64) + bn.eps()).sqrt();
  const torch::Tensor shift =
      bn.bias.to(torch::kFloat64) - bn.running_mean.to(torch::kFloat64) * scale;
  return {scale, shift};
}

// `weight` [out, ...] and `bias` [out] (undefined: none) with `input` before them (on the second
// dimension of a 2-D weight) and `bn` after them folded in, float32.
std::pair<torch::Tensor, torch::Tensor> fold(const torch::Tensor& weight, const torch::Tensor& bias,
                                             const BatchNormImpl* bn,
                                             const InputAffine* input = nullptr) {
  torch::Tensor w = weight.to(torch::kFloat64);
  torch::Tensor b = bias.defined() ? bias.to(torch::kFloat64) : torch::Tensor();
  if (input != nullptr) {
    const torch::Tensor shift = w.matmul(input->shift.to(torch::kFloat64));
    b = b.defined() ? b + shift : shift;
    w = w * input->scale.to(torch::kFloat64).view({1, -1});
  }
  if (bn != nullptr) {
    const auto [scale, shift] = bn_affine(*bn);
    std::vector<int64_t> shape(w.dim(), 1);
    shape[0] = -1;
    w = w * scale.view(shape);
    b = b.defined() ? b * scale + shift : shift;
  }
  return {w.to(torch::kFloat32), b.defined() ? b.to(torch::kFloat32) : b};
}

// A module option's alternative, or null: LibTorch 1.x holds its options in c10::variant, 2.x in
// std::variant.
template <typename T, typename Variant>
const T* alternative(const Variant& v) {
#if TORCH_VERSION_MAJOR >= 2
  return std::get_if<T>(&v);
#else
  return c10::get_if<T>(&v);
#endif
}

std::vector<int64_t> pair_of(const torch::ExpandingArray<2>& a) {
  return {(*a)[0], (*a)[1]};
}

// ONNX pads of a symmetric 2-D padding: begins, then ends.
std::vector<int64_t> pads_of(const torch::ExpandingArray<2>& a) {
  return {(*a)[0], (*a)[1], (*a)[0], (*a)[1]};
}

}  // namespace

std::string conv(OnnxGraph& g, const std::string& x, const torch::nn::Conv2dImpl& conv,
                 const std::string& name, const BatchNormImpl* bn) {
  const auto& o = conv.options;
  const auto* padding = alternative<torch::ExpandingArray<2>>(o.padding());
  MYRIAD_CHECK(padding != nullptr && alternative<torch::enumtype::kZeros>(o.padding_mode()),
               "{}: only explicit zero padding exports to ONNX", name);
  const auto [w, b] = fold(conv.weight, conv.bias, bn);
  std::vector<std::string> inputs{x, g.constant(name + ".weight", w)};
  if (b.defined()) inputs.push_back(g.constant(name + ".bias", b));
  return g.node("Conv", name, inputs,
                {{"kernel_shape", pair_of(o.kernel_size())},
                 {"strides", pair_of(o.stride())},
                 {"pads", pads_of(*padding)},
                 {"dilations", pair_of(o.dilation())},
                 {"group", o.groups()}});
}

std::string linear(OnnxGraph& g, const std::string& x, const torch::nn::LinearImpl& linear,
                   const std::string& name, const BatchNormImpl* bn, const InputAffine* input) {
  const auto [w, b] = fold(linear.weight, linear.bias, bn, input);
  std::vector<std::string> inputs{x, g.constant(name + ".weight", w)};
  if (b.defined()) inputs.push_back(g.constant(name + ".bias", b));
  return g.node("Gemm", name, inputs, {{"transB", int64_t{1}}});
}

std::string linear_tokens(OnnxGraph& g, const std::string& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const std::string& name,
                          const InputAffine* input) {
  const auto [w, b] = fold(weight, bias, nullptr, input);
  std::string y = g.node("MatMul", name, {x, g.constant(name + ".weight", w.t())});
  if (b.defined()) y = g.node("Add", name + ".add", {y, g.constant(name + ".bias", b)});
  return y;
}

std::string batch_norm(OnnxGraph& g, const std::string& x, const BatchNormImpl& bn,
                       const std::string& name, bool spatial) {
  const auto [scale, shift] = bn_affine(bn);
  const std::vector<int64_t> shape =
      spatial ? std::vector<int64_t>{-1, 1, 1} : std::vector<int64_t>{-1};
  const std::string y =
      g.node("Mul", name + ".scale",
             {x, g.constant(name + ".scale", scale.to(torch::kFloat32).view(shape))});
  return g.node("Add", name + ".shift",
                {y, g.constant(name + ".shift", shift.to(torch::kFloat32).view(shape))});
}

std::string prelu(OnnxGraph& g, const std::string& x, const torch::Tensor& slope,
                  const std::string& name) {
  return g.node("PRelu", name, {x, g.constant(name + ".weight", slope.view({-1, 1, 1}))});
}

std::string layer_norm(OnnxGraph& g, const std::string& x, const torch::nn::LayerNormImpl& norm,
                       const std::string& name, InputAffine* affine) {
  // Means over the last dimension as a product with [1/D ... 1/D]: OpenCV 4.6's ReduceMean gives
  // wrong shapes for batches of more than one.
  const int64_t dim = norm.weight.size(0);
  const std::string average =
      g.constant(name + ".average", torch::full({dim, 1}, 1.0 / static_cast<double>(dim)));
  const std::string mean = g.node("MatMul", name + ".mean", {x, average});
  const std::string centred = g.node("Sub", name + ".centre", {x, mean});
  const std::string square = g.node("Mul", name + ".square", {centred, centred});
  const std::string var = g.node("MatMul", name + ".var", {square, average});
  const std::string eps =
      g.constant(name + ".eps", torch::full({1}, norm.options.eps(), torch::kFloat32));
  const std::string deviation =
      g.node("Sqrt", name + ".std", {g.node("Add", name + ".add_eps", {var, eps})});
  *affine = {norm.weight, norm.bias};
  return g.node("Div", name + ".normalise", {centred, deviation});
}

std::string reshape(OnnxGraph& g, const std::string& x, const std::vector<int64_t>& rest,
                    const std::string& name) {
  // 0 copies the input's dimension: the dynamic batch.
  std::vector<int64_t> shape{0};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return g.node("Reshape", name, {x, g.constant(name + ".shape", torch::tensor(shape))});
}

std::string sequential(OnnxGraph& g, const std::string& x, const torch::nn::SequentialImpl& seq,
                       const std::string& name) {
  const auto children = seq.children();
  std::string y = x;
  for (size_t k = 0; k < children.size(); ++k) {
    const torch::nn::Module& m = *children[k];
    const std::string child = name + "." + std::to_string(k);
    const BatchNormImpl* next_bn =
        k + 1 < children.size() ? children[k + 1]->as<BatchNormImpl>() : nullptr;
    if (const auto* c = m.as<torch::nn::Conv2dImpl>()) {
      y = conv(g, y, *c, child, next_bn);
      k += next_bn != nullptr;
    } else if (const auto* l = m.as<torch::nn::LinearImpl>()) {
      y = linear(g, y, *l, child, next_bn);
      k += next_bn != nullptr;
    } else if (const auto* p = m.as<torch::nn::PReLUImpl>()) {
      y = prelu(g, y, p->weight, child);
    } else if (m.as<torch::nn::ReLUImpl>() != nullptr) {
      y = g.node("Relu", child, {y});
    } else if (const auto* pool = m.as<torch::nn::MaxPool2dImpl>()) {
      const auto& o = pool->options;
      MYRIAD_CHECK(!o.ceil_mode() && (*o.dilation())[0] == 1 && (*o.dilation())[1] == 1,
                   "{}: only plain max pooling exports to ONNX", child);
      y = g.node("MaxPool", child, {y},
                 {{"kernel_shape", pair_of(o.kernel_size())},
                  {"strides", pair_of(o.stride())},
                  {"pads", pads_of(o.padding())}});
    } else if (m.as<torch::nn::FlattenImpl>() != nullptr) {
      y = g.node("Flatten", child, {y}, {{"axis", int64_t{1}}});
    } else if (const auto* own = dynamic_cast<const OnnxModule*>(&m)) {
      y = own->to_onnx(g, y, child);
    } else {
      // Batch norm lands here only without a convolution or linear layer before it.
      MYRIAD_THROW("{} ({}) has no ONNX export", child, m.name());
    }
  }
  return y;
}

}  // namespace onnx_layers

std::vector<std::string> write_onnx(const Backbone& backbone, const BackboneOptions& options,
                                    const std::string& path) {
  const InputShape& in = options.input;
  OnnxGraph g("data", {in.channels, in.height, in.width});
  torch::NoGradGuard no_grad;
  g.set_output(backbone.to_onnx(g, g.input()), "embedding", {options.embedding_size});
  const std::string data_path = path + ".data";
  AtomicOutput model(path);
  if (!g.needs_external_data()) {
    g.write(model.temporary_path(), "", "");
    model.commit();
    return {path};
  }
  AtomicOutput data(data_path);
  g.write(model.temporary_path(), data.temporary_path(),
          std::filesystem::path(data_path).filename().string());
  // The data first: a model never names data that is not there yet.
  data.commit();
  model.commit();
  return {path, data_path};
}

}  // namespace myriad
