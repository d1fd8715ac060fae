#include "myriad/ckpt/manifest.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "myriad/ckpt/checksum.h"
#include "myriad/util/error.h"

namespace myriad {

std::string shard_file_name(int rank) {
  return str_format("classifier-{:05}.h5", rank);
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json j;
  j["format"] = "myriad-checkpoint";
  j["format_version"] = format_version;
  j["step"] = step;
  j["epoch"] = position.epoch;
  j["epoch_offset"] = position.offset;
  j["world_size"] = world_size;
  j["num_classes"] = num_classes;
  j["embedding_size"] = embedding_size;
  for (const ShardEntry& s : shards) {
    j["shards"].push_back(
        {{"file", s.file}, {"rank", s.rank}, {"class_offset", s.class_offset}, {"rows", s.rows}});
  }
  for (const auto& [name, f] : files)
    j["files"][name] = {{"bytes", f.bytes}, {"crc32", crc32_hex(f.crc32)}};
  j["config"] = config;
  j["created"] = created;
  return j;
}

namespace {

// An integer field. nlohmann converts a floating-point value (1e30) to an integer type without a
// range check, which is undefined behaviour; only integers are accepted.
int64_t integer(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& value = j.at(key);
  MYRIAD_CHECK(value.is_number_integer(), "{}: {} is not an integer", where, key);
  return value.get<int64_t>();
}

int small_integer(const nlohmann::json& j, const char* key, const std::string& where) {
  const int64_t value = integer(j, key, where);
  MYRIAD_CHECK(value >= 0 && value <= std::numeric_limits<int>::max(), "{}: {} is {}", where, key,
               value);
  return static_cast<int>(value);
}

}  // namespace

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& where) {
  Manifest m;
  try {
    MYRIAD_CHECK(j.at("format").get<std::string>() == "myriad-checkpoint",
                 "{} is not a myriad checkpoint manifest", where);
    m.format_version = integer(j, "format_version", where);
    MYRIAD_CHECK(m.format_version == kCheckpointFormatVersion,
                 "{}: format version {}, this myriad reads {}", where, m.format_version,
                 kCheckpointFormatVersion);
    m.step = integer(j, "step", where);
    m.position.epoch = integer(j, "epoch", where);
    m.position.offset = integer(j, "epoch_offset", where);
    m.world_size = small_integer(j, "world_size", where);
    m.num_classes = integer(j, "num_classes", where);
    m.embedding_size = integer(j, "embedding_size", where);
    for (const auto& s : j.at("shards")) {
      m.shards.push_back({s.at("file").get<std::string>(), small_integer(s, "rank", where),
                          integer(s, "class_offset", where), integer(s, "rows", where)});
    }
    m.files = file_entries_from_json(j.at("files"), where);
    m.config = j.value("config", "");
    m.created = j.value("created", "");
  } catch (const nlohmann::json::exception& e) {
    MYRIAD_THROW("{} is malformed: {}", where, e.what());
  }
  MYRIAD_CHECK(m.step >= 0 && m.position.epoch >= 0 && m.position.offset >= 0,
               "{}: negative step or data position", where);
  MYRIAD_CHECK(m.num_classes > 0 && m.embedding_size > 0 && m.embedding_size <= kMaxEmbeddingSize,
               "{}: a classifier of {} classes x {} is not one myriad writes", where, m.num_classes,
               m.embedding_size);
  MYRIAD_CHECK(m.world_size > 0 && static_cast<int>(m.shards.size()) == m.world_size,
               "{} lists {} shards for {} ranks", where, m.shards.size(), m.world_size);
  int64_t next = 0;
  for (const ShardEntry& s : m.shards) {
    MYRIAD_CHECK(s.class_offset == next && s.rows > 0 && s.rows <= m.num_classes - next,
                 "{}: shard {} does not continue the class ranges", where, s.file);
    MYRIAD_CHECK(m.files.count(s.file) > 0, "{}: shard {} has no size and checksum", where, s.file);
    next += s.rows;
  }
  MYRIAD_CHECK(next == m.num_classes, "{}: shards cover {} of {} classes", where, next,
               m.num_classes);
  MYRIAD_CHECK(m.files.count(kReplicatedFile) > 0, "{}: no {}", where, kReplicatedFile);
  return m;
}

std::map<std::string, FileEntry> file_entries_from_json(const nlohmann::json& j,
                                                        const std::string& where) {
  std::map<std::string, FileEntry> files;
  try {
    for (const auto& [name, f] : j.items()) {
      // Names are of files inside the checkpoint directory: nothing may point elsewhere.
      MYRIAD_CHECK(!name.empty() && name != "." && name != ".." &&
                       name.find('/') == std::string::npos && name.find('\0') == std::string::npos,
                   "{}: '{}' is not the name of a file in the checkpoint directory", where, name);
      const std::string crc = f.at("crc32").get<std::string>();
      MYRIAD_CHECK(!crc.empty() && crc.size() <= 8 &&
                       crc.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
                   "{}: the checksum of {} is not hexadecimal (up to 8 digits)", where, name);
      files[name] = {integer(f, "bytes", where),
                     static_cast<uint32_t>(std::stoul(crc, nullptr, 16))};
      MYRIAD_CHECK(files[name].bytes >= 0, "{}: {} has a negative size", where, name);
    }
  } catch (const nlohmann::json::exception& e) {
    MYRIAD_THROW("{}: malformed file list: {}", where, e.what());
  }
  return files;
}

Manifest read_manifest(const std::string& directory) {
  const std::string path = (std::filesystem::path(directory) / kManifestFile).string();
  std::ifstream in(path);
  MYRIAD_CHECK(in.good(), "'{}' is missing: the checkpoint is incomplete", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    MYRIAD_THROW("'{}' is not valid JSON (truncated or corrupt): {}", path, e.what());
  }
  return Manifest::from_json(j, "'" + path + "'");
}

}  // namespace myriad
