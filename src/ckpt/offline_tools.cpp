#include "myriad/ckpt/offline_tools.h"

#include <filesystem>
#include <fstream>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/class_rows.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/balanced_split.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace fs = std::filesystem;

namespace {

// The datasets of a classifier shard: weight and the optimizer state rows.
std::vector<std::string> shard_datasets(const std::string& checkpoint, const Manifest& manifest) {
  const Hdf5File first((fs::path(checkpoint) / manifest.shards.at(0).file).string(),
                       Hdf5File::Mode::kRead);
  std::vector<std::string> names = {"weight"};
  if (first.has("state")) {
    for (const std::string& state : first.list("state")) names.push_back("state/" + state);
  }
  return names;
}

}  // namespace

void merge_classifier(const std::string& checkpoint, const std::string& output) {
  const Manifest manifest = verify_checkpoint(checkpoint);
  AtomicOutput out(output);
  {
    Hdf5File file(out.temporary_path(), Hdf5File::Mode::kCreate);
    file.create("weight", torch::kFloat32, {manifest.num_classes, manifest.embedding_size}, 4096);
    ProgressBar progress("merging", manifest.num_classes);
    read_class_rows(checkpoint, manifest, "weight", 0, manifest.num_classes,
                    [&](int64_t at, const torch::Tensor& rows) {
                      file.write_rows("weight", at, rows);
                      progress.advance(rows.size(0));
                    });
    progress.finish();
    file.set_attribute("/", "num_classes", manifest.num_classes);
    file.set_attribute("/", "embedding_size", manifest.embedding_size);
    file.set_attribute("/", "step", manifest.step);
  }
  out.commit();
  log_info("wrote {}: weight [{}, {}] of step {}", output, manifest.num_classes,
           manifest.embedding_size, manifest.step);
}

void reshard_checkpoint(const std::string& checkpoint, const std::string& output, int world_size) {
  const Manifest old = verify_checkpoint(checkpoint);
  MYRIAD_CHECK(world_size <= old.num_classes,
               "{} classes cannot be split over {} ranks: every rank must own at least one class",
               old.num_classes, world_size);
  const std::vector<int64_t> sizes = balanced_counts(old.num_classes, world_size);
  const std::vector<int64_t> offsets = offsets_of(sizes);
  MYRIAD_CHECK(!fs::exists(output), "'{}' exists already", output);
  AtomicOutput out(output);
  const std::string& temporary = out.temporary_path();
  std::error_code error;
  fs::create_directories(temporary, error);
  MYRIAD_CHECK(!error, "cannot create '{}': {}", temporary, error.message());
  fs::copy_file(fs::path(checkpoint) / kReplicatedFile, fs::path(temporary) / kReplicatedFile,
                error);
  MYRIAD_CHECK(!error, "cannot copy {}: {}", kReplicatedFile, error.message());
  Manifest manifest = old;
  manifest.world_size = world_size;
  manifest.shards.clear();
  manifest.files.clear();
  const std::vector<std::string> datasets = shard_datasets(checkpoint, old);
  ProgressBar progress("resharding", old.num_classes);
  for (int r = 0; r < world_size; ++r) {
    const std::string name = shard_file_name(r);
    {
      Hdf5File file((fs::path(temporary) / name).string(), Hdf5File::Mode::kCreate);
      for (const std::string& dataset : datasets) {
        file.create(dataset, torch::kFloat32, {sizes[r], old.embedding_size}, 4096);
        read_class_rows(
            checkpoint, old, dataset, offsets[r], offsets[r] + sizes[r],
            [&](int64_t at, const torch::Tensor& rows) { file.write_rows(dataset, at, rows); });
      }
      file.set_attribute("/", "rank", static_cast<int64_t>(r));
      file.set_attribute("/", "class_offset", offsets[r]);
      file.set_attribute("/", "rows", sizes[r]);
    }
    manifest.shards.push_back({name, r, offsets[r], sizes[r]});
    progress.advance(sizes[r]);
  }
  progress.finish();
  for (const auto& entry : fs::directory_iterator(temporary)) {
    const std::string path = entry.path().string();
    sync_path(path);
    manifest.files[entry.path().filename().string()] = {static_cast<int64_t>(fs::file_size(path)),
                                                        file_crc32(path)};
  }
  write_file_atomically((fs::path(temporary) / kManifestFile).string(),
                        manifest.to_json().dump(2) + "\n");
  out.commit();
  log_info("wrote {}: step {} split for {} ranks (from {})", output, manifest.step, world_size,
           old.world_size);
}

}  // namespace myriad
