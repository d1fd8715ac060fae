#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "myriad/data/distributed_sampler.h"

namespace myriad {

constexpr int64_t kCheckpointFormatVersion = 1;
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kReplicatedFile = "replicated.h5";
// Larger embeddings than any model uses mark a manifest as damaged.
constexpr int64_t kMaxEmbeddingSize = int64_t{1} << 20;

// "classifier-00003.h5": the classifier shard rank 3 wrote.
std::string shard_file_name(int rank);

struct ShardEntry {
  std::string file;
  int rank = 0;
  int64_t class_offset = 0;
  int64_t rows = 0;
};

struct FileEntry {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// manifest.json of a checkpoint directory (docs/checkpoint-format.md).
struct Manifest {
  int64_t format_version = kCheckpointFormatVersion;
  int64_t step = 0;       // steps done
  DataPosition position;  // of the next batch
  int world_size = 0;
  int64_t num_classes = 0;
  int64_t embedding_size = 0;
  std::vector<ShardEntry> shards;
  std::map<std::string, FileEntry> files;
  std::string config;   // the run's effective configuration (INI)
  std::string created;  // UTC, ISO 8601

  nlohmann::json to_json() const;
  // A malformed manifest is an Error naming `where`.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

Manifest read_manifest(const std::string& directory);

// {"name": {"bytes": N, "crc32": "hex"}, ...}, as in a manifest's "files".
std::map<std::string, FileEntry> file_entries_from_json(const nlohmann::json& j,
                                                        const std::string& where);

}  // namespace myriad
