#include "myriad/ckpt/checkpoint_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "myriad/ckpt/checksum.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/log.h"
#include "myriad/util/remove_tree.h"

namespace myriad {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatestFile = "LATEST";

std::string step_name(int64_t step) {
  return str_format("step-{:09}", step);
}

int64_t step_of(const std::string& name) {
  const std::string prefix = "step-";
  if (name.rfind(prefix, 0) != 0) return -1;
  try {
    size_t used = 0;
    const int64_t step = std::stoll(name.substr(prefix.size()), &used);
    return used == name.size() - prefix.size() ? step : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

CheckpointStore::CheckpointStore(std::string root) : root_(std::move(root)) {}

std::string CheckpointStore::directory_for(int64_t step) const {
  return (fs::path(root_) / step_name(step)).string();
}

std::string CheckpointStore::temporary_for(int64_t step) const {
  return (fs::path(root_) / (".tmp-" + step_name(step))).string();
}

void CheckpointStore::check_writable() const {
  std::error_code error;
  fs::create_directories(root_, error);
  MYRIAD_CHECK(!error, "cannot create the checkpoint directory '{}': {}", root_, error.message());
  const std::string probe = (fs::path(root_) / ".tmp-probe").string();
  write_file_atomically(probe, "");
  fs::remove(probe, error);
  MYRIAD_CHECK(!error, "cannot write to the checkpoint directory '{}': {}", root_, error.message());
}

std::vector<std::string> CheckpointStore::complete() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && fs::exists(entry.path() / kManifestFile))
      found.emplace_back(step, entry.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

std::optional<std::string> CheckpointStore::latest() const {
  std::ifstream in(fs::path(root_) / kLatestFile);
  std::string name;
  if (!(in >> name)) return std::nullopt;
  return (fs::path(root_) / name).string();
}

void CheckpointStore::publish(const std::string& temporary, int64_t step) const {
  const std::string final_path = directory_for(step);
  const std::string stale = remove_tree(final_path);
  MYRIAD_CHECK(stale.empty(), "cannot replace '{}': {}", final_path, stale);
  std::error_code error;
  fs::rename(temporary, final_path, error);
  MYRIAD_CHECK(!error, "cannot rename '{}' to '{}': {}", temporary, final_path, error.message());
  sync_path(root_);
  fault_point("publish", step);
  write_file_atomically((fs::path(root_) / kLatestFile).string(), step_name(step) + "\n");
}

void CheckpointStore::prune(int64_t step, int keep) const {
  const std::string final_path = directory_for(step);
  // The one just published always stays, whatever its step: a run resumed from an older
  // checkpoint publishes below checkpoints it abandoned.
  std::vector<std::string> others = complete();
  others.erase(std::remove(others.begin(), others.end(), final_path), others.end());
  for (size_t i = static_cast<size_t>(std::max(keep, 1)) - 1; i < others.size(); ++i) {
    const std::string failure = remove_tree(others[i]);
    if (!failure.empty()) log_warn("could not remove old checkpoint: {}", failure);
  }
}

void CheckpointStore::remove_stale_temporaries() const {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) {
      log_warn("removing '{}', left by a checkpoint that was never finished",
               entry.path().string());
      const std::string failure = remove_tree(entry.path().string());
      if (!failure.empty()) log_warn("{}", failure);
    }
  }
}

Manifest verify_checkpoint(const std::string& directory, const std::vector<std::string>& files) {
  const Manifest manifest = read_manifest(directory);
  std::vector<std::string> names = files;
  if (names.empty()) {
    for (const auto& [name, entry] : manifest.files) names.push_back(name);
  }
  for (const std::string& name : names) {
    const auto it = manifest.files.find(name);
    MYRIAD_CHECK(it != manifest.files.end(), "'{}' has no entry for {} in its manifest", directory,
                 name);
    const std::string path = (fs::path(directory) / name).string();
    std::error_code error;
    const auto bytes = fs::file_size(path, error);
    MYRIAD_CHECK(!error, "'{}' is missing: the checkpoint is incomplete", path);
    MYRIAD_CHECK(static_cast<int64_t>(bytes) == it->second.bytes,
                 "'{}' has {} bytes, its manifest says {} (truncated?)", path, bytes,
                 it->second.bytes);
    const uint32_t crc = file_crc32(path);
    MYRIAD_CHECK(crc == it->second.crc32, "'{}' is corrupt: checksum {} but its manifest says {}",
                 path, crc32_hex(crc), crc32_hex(it->second.crc32));
  }
  return manifest;
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifestFile)) return path;
  const CheckpointStore store(path);
  if (const std::optional<std::string> latest = store.latest();
      latest.has_value() && fs::exists(fs::path(*latest) / kManifestFile)) {
    return *latest;
  }
  const std::vector<std::string> all = store.complete();
  MYRIAD_CHECK(!all.empty(), "'{}' is neither a checkpoint nor a directory of checkpoints", path);
  return all.front();
}

std::vector<std::string> resume_candidates(const std::string& resume,
                                           const CheckpointStore& store) {
  if (resume == "none") return {};
  if (resume != "auto") return {resume};
  // LATEST names the checkpoint the run published last, which need not have the highest step (a
  // run resumed from an older one publishes below the ones it abandoned).
  std::vector<std::string> candidates = store.complete();
  if (const std::optional<std::string> latest = store.latest(); latest.has_value()) {
    candidates.erase(std::remove(candidates.begin(), candidates.end(), *latest), candidates.end());
    candidates.insert(candidates.begin(), *latest);
  }
  return candidates;
}

}  // namespace myriad
