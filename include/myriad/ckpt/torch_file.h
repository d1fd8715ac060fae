#pragma once

#include <string>

#include "myriad/util/state_dict.h"

namespace myriad {

// Writes `state` as torch.save does (a zip archive of data.pkl and one record per storage), for
// torch.load, which gives a dict of name -> tensor in this order. Aggregates stay untagged:
// torch.load's default weights_only mode refuses torch::pickle_save's restore_type_tag.
void write_torch_state_dict(const StateDict& state, const std::string& path);

// Reads a state dict that torch.save wrote (the zip format of PyTorch >= 1.6), as data: the
// archive's directory and its stored records are parsed here, and its pickle by the restricted
// unpickler, which admits only the globals collections.OrderedDict,
// torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and torch's typed storages
// (torch.FloatStorage, ...), with persistent ids and BUILD. Anything else, the legacy non-zip
// format, TorchScript archives, compressed or encrypted entries, checksum mismatches and tensors
// outside their storage are each an Error naming `path`.
//
// The dict may be the state dict itself, or an arcface_torch training checkpoint, whose
// `state_dict_backbone` it then returns; a `module.` prefix (DataParallel's) is removed from every
// name that has it. Tensors come back contiguous, on the CPU.
StateDict read_torch_state_dict(const std::string& path);

}  // namespace myriad
