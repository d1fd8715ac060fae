#include "support/interop.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace myriad::testing {

std::string interop_file(const std::string& name) {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/data/interop/" + name;
}

std::vector<KeyEntry> read_keys(const std::string& net) {
  std::ifstream in(interop_file(net + ".keys"));
  if (!in) throw std::runtime_error("cannot read the key file of " + net);
  std::vector<KeyEntry> keys;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    KeyEntry k;
    std::string shape;
    fields >> k.name >> shape >> k.dtype;
    if (shape != "scalar") {
      std::istringstream dims(shape);
      std::string d;
      while (std::getline(dims, d, 'x')) k.shape.push_back(std::stoll(d));
    }
    keys.push_back(k);
  }
  return keys;
}

namespace {

// r in [-1, 1) for element i of tensor j, in unsigned 64-bit wrapping arithmetic.
double formula_r(uint64_t j, uint64_t i) {
  uint64_t x = (j << 32) + i + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return static_cast<double>(x >> 11) * std::ldexp(1.0, -52) - 1.0;
}

}  // namespace

void set_formula_weights(Backbone& net) {
  torch::NoGradGuard no_grad;
  uint64_t j = 0;
  for (auto& [name, tensor] : net.state_dict()) {
    const std::string leaf =
        name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
    const int64_t n = tensor.numel();
    const double fan_in = tensor.dim() > 0 ? static_cast<double>(n) / tensor.size(0) : 1.0;
    // value = offset + scale * (absolute ? |r| : r)
    double offset = 0.0, scale = 0.02;
    bool absolute = false;
    if (leaf == "num_batches_tracked") {
      scale = 0.0;
    } else if (leaf == "running_var") {
      offset = 1.0;
      scale = 0.5;
      absolute = true;
    } else if (leaf == "running_mean" || leaf == "bias") {
      scale = 0.05;
    } else if (leaf == "weight" && tensor.dim() == 2) {
      scale = 3.0 * std::sqrt(3.0) / std::sqrt(fan_in);
    } else if (leaf == "weight" && tensor.dim() > 2) {
      scale = std::sqrt(3.0) / std::sqrt(fan_in);
    } else if (leaf == "weight") {
      offset = 1.0;
      scale = 0.1;
    }
    torch::Tensor values = torch::empty({n}, torch::kFloat64);
    double* v = values.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double r = formula_r(j, static_cast<uint64_t>(i));
      v[i] = offset + scale * (absolute ? std::abs(r) : r);
    }
    tensor.copy_(values.view(tensor.sizes()));
    ++j;
  }
}

}  // namespace myriad::testing
