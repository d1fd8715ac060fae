// Checkpoint manifests (manifest.json): JSON parsing, then every field myriad trusts.

#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "myriad/ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string dir = fuzz::scratch_directory();
  fuzz::write_file(dir + "/" + kManifestFile, text);
  fuzz::expect_clean([&] {
    const Manifest m = read_manifest(dir);
    // What the readers of a checkpoint rely on once from_json accepted it.
    int64_t covered = 0;
    for (const ShardEntry& s : m.shards) covered += s.rows;
    if (covered != m.num_classes || m.embedding_size <= 0) __builtin_trap();
    for (const auto& [name, entry] : m.files) {
      if (name.find('/') != std::string::npos || name == ".." || entry.bytes < 0) __builtin_trap();
    }
    // A manifest written back reads back the same.
    const Manifest again = Manifest::from_json(nlohmann::json::parse(m.to_json().dump()), "again");
    if (again.files.size() != m.files.size() || again.shards.size() != m.shards.size()) {
      __builtin_trap();
    }
  });
  return 0;
}
