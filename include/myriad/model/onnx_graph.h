#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "myriad/util/protobuf_writer.h"

namespace myriad {

class BatchNormImpl;

struct OnnxAttribute {
  std::string name;
  std::variant<int64_t, float, std::vector<int64_t>> value;
};

// An ONNX inference graph under construction (onnx.proto, opset kOnnxOpset of the default domain),
// one float32 input whose first dimension (the batch) is dynamic, and one output. Nodes are named
// after the modules they come from ("layer1.0.conv1"): insightface's ArcFaceONNX takes a graph
// whose first nodes are named Sub... and Mul... for one that normalises its own input.
class OnnxGraph {
 public:
  // Opset 13 (ONNX 1.8): old enough for OpenCV 4.6's importer, TensorRT and every onnxruntime;
  // every operator used here has kept its meaning from 13 to 17.
  static constexpr int64_t kOnnxOpset = 13;

  // `shape`: the input's dimensions after the batch.
  OnnxGraph(std::string input_name, std::vector<int64_t> shape);

  const std::string& input() const { return input_name_; }
  // An initializer (float32, or int64 for shapes) named `name` (made unique); returns its name.
  std::string constant(const std::string& name, const torch::Tensor& value);
  // A node of operator `op` named `name` (made unique), with one output named as the node;
  // returns the output's name.
  std::string node(const std::string& op, const std::string& name,
                   const std::vector<std::string>& inputs,
                   std::vector<OnnxAttribute> attributes = {});
  // Makes `value`, a node's output, the graph's output `name`, of shape [batch, shape...].
  void set_output(const std::string& value, const std::string& name, std::vector<int64_t> shape);

  // The model as an ONNX file at `path`. When the initializers pass protobuf's 2 GiB limit, they
  // go to `data_path` instead (ONNX's external data), which the model names `data_location`
  // (relative to the model's directory). Not atomic: callers write to temporary paths.
  void write(const std::string& path, const std::string& data_path,
             const std::string& data_location) const;
  // Whether write() puts the initializers into a separate data file.
  bool needs_external_data() const;

 private:
  struct Node {
    std::string op, name;
    std::vector<std::string> inputs;
    std::vector<OnnxAttribute> attributes;
    std::string output;
  };
  struct Initializer {
    std::string name;
    torch::Tensor value;  // contiguous float32 or int64 on the CPU
  };
  // An initializer's TensorProto without its raw bytes; `size` counts them where they are inline.
  struct InitializerHeader {
    ProtoMessage message;
    uint64_t size = 0;
    bool outside = false;  // the bytes go to the data file
  };
  std::string unique(const std::string& name);
  int64_t initializer_bytes() const;
  // The nodes, the input and the output: the graph but for its initializers.
  ProtoMessage graph_without_initializers() const;
  // `offset` (into the data file) moves past the initializer's bytes where they go there.
  static InitializerHeader header_of(const Initializer& i, bool external,
                                     const std::string& data_location, int64_t& offset);

  std::string input_name_;
  std::vector<int64_t> input_shape_;
  std::string output_name_;
  std::vector<int64_t> output_shape_;
  std::vector<Node> nodes_;
  std::vector<Initializer> initializers_;
  std::vector<std::string> names_;
};

// Layers in ONNX, each named after its module. Batch norm uses its running statistics; folded
// into the convolution or linear layer before it where there is one (computed in float64).
namespace onnx_layers {

// y = x * scale + shift over a linear layer's input features, folded into its weights (LayerNorm's
// affine part: OpenCV 4.6 broadcasts a constant over dim 1 only, not over the last dimension).
struct InputAffine {
  torch::Tensor scale, shift;
};

// Conv2d (with its bias, if any), followed by `bn` folded in when given.
std::string conv(OnnxGraph& g, const std::string& x, const torch::nn::Conv2dImpl& conv,
                 const std::string& name, const BatchNormImpl* bn = nullptr);
// Linear on [N, in] (Gemm), `input` before it and `bn` after it folded in when given.
std::string linear(OnnxGraph& g, const std::string& x, const torch::nn::LinearImpl& linear,
                   const std::string& name, const BatchNormImpl* bn = nullptr,
                   const InputAffine* input = nullptr);
// Linear on [N, T, in] (MatMul, Add), `input` before it folded in when given.
std::string linear_tokens(OnnxGraph& g, const std::string& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const std::string& name,
                          const InputAffine* input = nullptr);
// Batch norm alone, on [N, C] or [N, C, H, W] (`spatial`): x * scale + shift.
std::string batch_norm(OnnxGraph& g, const std::string& x, const BatchNormImpl& bn,
                       const std::string& name, bool spatial);
// PReLU with one slope per channel of [N, C, H, W].
std::string prelu(OnnxGraph& g, const std::string& x, const torch::Tensor& slope,
                  const std::string& name);
// LayerNorm over the last dimension in basic operators (OpenCV 4.6 has no LayerNormalization, of
// opset 17), without its affine part, which `affine` returns for the linear layers after it.
std::string layer_norm(OnnxGraph& g, const std::string& x, const torch::nn::LayerNormImpl& norm,
                       const std::string& name, InputAffine* affine);
// [N, ...] -> [N, rest...]: the batch dimension stays dynamic.
std::string reshape(OnnxGraph& g, const std::string& x, const std::vector<int64_t>& rest,
                    const std::string& name);

// A Sequential's modules in order: Conv2d (with the BatchNorm right after it folded in), Linear
// (likewise), BatchNorm, PReLU, ReLU, MaxPool2d, Flatten; and modules implementing OnnxModule.
// `name` is the Sequential's state-dict prefix.
std::string sequential(OnnxGraph& g, const std::string& x, const torch::nn::SequentialImpl& seq,
                       const std::string& name);

}  // namespace onnx_layers

// A module of a backbone's own that sequential() exports.
class OnnxModule {
 public:
  virtual ~OnnxModule() = default;
  virtual std::string to_onnx(OnnxGraph& g, const std::string& x,
                              const std::string& name) const = 0;
};

class Backbone;
struct BackboneOptions;

// The inference graph of `backbone` as an ONNX file at `path`: input "data" [batch, C, H, W]
// float32 of pixels already mapped to x / 127.5 - 1 (outside the graph, as myriad-embed and
// arcface_torch's torch2onnx do), output "embedding" [batch, D], not normalised. Batch norm uses
// its running statistics, dropout is off. Written under temporary names and renamed into place
// when complete; a backbone beyond protobuf's 2 GiB limit also gets `path`.data. Returns the
// paths written.
std::vector<std::string> write_onnx(const Backbone& backbone, const BackboneOptions& options,
                                    const std::string& path);

}  // namespace myriad
