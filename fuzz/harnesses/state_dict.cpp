// torch.save files for --init-backbone and myriad-embed: the zip archive's directory and records,
// the restricted unpickler with its allowed globals, storages, and tensors' sizes, strides and
// offsets against their storages.

#include "fuzz_input.h"
#include "myriad/ckpt/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string path = fuzz::scratch_directory() + "/weights.pth";
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean([&] {
    for (const auto& [name, tensor] : read_torch_state_dict(path)) {
      // Tensors come back whole and contiguous on the CPU: every element readable.
      if (!tensor.is_contiguous() || !tensor.device().is_cpu()) __builtin_trap();
      if (tensor.numel() > 0 && tensor.scalar_type() == torch::kFloat32) tensor.sum();
    }
  });
  return 0;
}
