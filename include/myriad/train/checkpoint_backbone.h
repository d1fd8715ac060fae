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

// The backbone of checkpoint `directory` as a torch.save state dict, under insightface's names
// and in its state_dict() order, so that arcface_torch's model of the same network loads it with
// load_state_dict(strict=True). Written under a temporary name, renamed into place when complete.
void export_backbone(const std::string& directory, const std::string& output);

// Starts `backbone` from a torch.save state dict (read_torch_state_dict: read as data, a `module.`
// prefix and arcface_torch's training checkpoints accepted), which must fit it exactly.
void init_backbone(Backbone& backbone, const std::string& path);

}  // namespace myriad
