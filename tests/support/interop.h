#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "myriad/model/backbone.h"

namespace myriad::testing {

// One line of an arcface_torch key file (tests/data/interop/NET.keys).
struct KeyEntry {
  std::string name;
  std::vector<int64_t> shape;  // empty for a scalar
  std::string dtype;           // "float32", "int64"
};

// tests/data/interop/NET.keys, in order.
std::vector<KeyEntry> read_keys(const std::string& net);
std::string interop_file(const std::string& name);

// Sets every state-dict entry of `net` to the golden file's weight formula
// (tests/data/interop/README.md), entry j of the state dict taking tensor number j.
void set_formula_weights(Backbone& net);

}  // namespace myriad::testing
