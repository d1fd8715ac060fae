#include "myriad/model/backbone.h"

#include <sstream>

#include "myriad/model/iresnet.h"
#include "myriad/model/mobilefacenet.h"
#include "myriad/model/small_cnn.h"
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

const std::vector<std::string>& backbone_names() {
  static const std::vector<std::string> names = {"iresnet18",  "iresnet34",     "iresnet50",
                                                 "iresnet100", "mobilefacenet", "smallcnn"};
  return names;
}

std::shared_ptr<Backbone> make_backbone(const BackboneOptions& options) {
  MYRIAD_CHECK_COLLECTIVE(options.embedding_size > 0, "the embedding size must be positive");
  if (options.name == "iresnet18")
    return std::make_shared<IResNet>(options, std::vector<int64_t>{2, 2, 2, 2});
  if (options.name == "iresnet34")
    return std::make_shared<IResNet>(options, std::vector<int64_t>{3, 4, 6, 3});
  if (options.name == "iresnet50")
    return std::make_shared<IResNet>(options, std::vector<int64_t>{3, 4, 14, 3});
  if (options.name == "iresnet100")
    return std::make_shared<IResNet>(options, std::vector<int64_t>{3, 13, 30, 3});
  if (options.name == "mobilefacenet") return std::make_shared<MobileFaceNet>(options);
  if (options.name == "smallcnn") return std::make_shared<SmallCnn>(options);
  std::string known;
  for (const std::string& n : backbone_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError(str_format("unknown backbone '{}' ({})", options.name, known));
}

}  // namespace myriad
