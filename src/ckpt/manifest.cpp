#include "myriad/ckpt/manifest.h"

#include <filesystem>
#include <fstream>

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

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& where) {
  Manifest m;
  try {
    MYRIAD_CHECK(j.at("format").get<std::string>() == "myriad-checkpoint",
                 "{} is not a myriad checkpoint manifest", where);
    m.format_version = j.at("format_version").get<int64_t>();
    MYRIAD_CHECK(m.format_version == kCheckpointFormatVersion,
                 "{}: format version {}, this myriad reads {}", where, m.format_version,
                 kCheckpointFormatVersion);
    m.step = j.at("step").get<int64_t>();
    m.position.epoch = j.at("epoch").get<int64_t>();
    m.position.offset = j.at("epoch_offset").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.num_classes = j.at("num_classes").get<int64_t>();
    m.embedding_size = j.at("embedding_size").get<int64_t>();
    for (const auto& s : j.at("shards")) {
      m.shards.push_back({s.at("file").get<std::string>(), s.at("rank").get<int>(),
                          s.at("class_offset").get<int64_t>(), s.at("rows").get<int64_t>()});
    }
    m.files = file_entries_from_json(j.at("files"), where);
    m.config = j.value("config", "");
    m.created = j.value("created", "");
  } catch (const nlohmann::json::exception& e) {
    MYRIAD_THROW("{} is malformed: {}", where, e.what());
  }
  MYRIAD_CHECK(static_cast<int>(m.shards.size()) == m.world_size, "{} lists {} shards for {} ranks",
               where, m.shards.size(), m.world_size);
  int64_t next = 0;
  for (const ShardEntry& s : m.shards) {
    MYRIAD_CHECK(s.class_offset == next && s.rows > 0,
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
      files[name] = {
          f.at("bytes").get<int64_t>(),
          static_cast<uint32_t>(std::stoul(f.at("crc32").get<std::string>(), nullptr, 16))};
    }
  } catch (const nlohmann::json::exception& e) {
    MYRIAD_THROW("{}: malformed file list: {}", where, e.what());
  } catch (const std::logic_error&) {
    MYRIAD_THROW("{}: a checksum is not hexadecimal", where);
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
