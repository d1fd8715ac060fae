#pragma once

#include <memory>
#include <string>

#include "myriad/model/backbone.h"

namespace myriad {

// The backbone of checkpoint `directory`, as its run built it (the manifest's configuration), with
// the checkpoint's weights (also under the names of before myriad took insightface's), in eval
// mode on the CPU. The checkpoint's files are verified first. `options`, when given, receives the
// backbone's options.
std::shared_ptr<Backbone> load_checkpoint_backbone(const std::string& directory,
                                                   BackboneOptions* options = nullptr);

// What export_backbone writes.
enum class BackboneFormat {
  // A torch.save state dict, under insightface's names and in its state_dict() order, so that
  // arcface_torch's model of the same network loads it with load_state_dict(strict=True).
  kStateDict,
  // The inference graph as ONNX (write_onnx in myriad/model/onnx_graph.h), for onnxruntime,
  // OpenCV, TensorRT and insightface's ArcFaceONNX.
  kOnnx,
};

// "state-dict" or "onnx"; anything else is a UsageError.
BackboneFormat parse_backbone_format(const std::string& text);

// The backbone of checkpoint `directory` in `format`, written under a temporary name and renamed
// into place when complete.
void export_backbone(const std::string& directory, const std::string& output,
                     BackboneFormat format = BackboneFormat::kStateDict);

// Starts `backbone` from a torch.save state dict (read_torch_state_dict: read as data, a `module.`
// prefix and arcface_torch's training checkpoints accepted), which must fit it exactly.
void init_backbone(Backbone& backbone, const std::string& path);

}  // namespace myriad
