#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "myriad/ckpt/manifest.h"

namespace myriad {

// A checkpoint directory (docs/checkpoint-format.md): complete checkpoints `step-<step>/`, the
// pointer file `LATEST` naming the newest, and `.tmp-step-<step>/` while one is being written. A
// checkpoint becomes visible only by the rename of its finished temporary directory, and LATEST
// is replaced after that, so a crash at any point leaves the previous checkpoint in use.
class CheckpointStore {
 public:
  explicit CheckpointStore(std::string root);

  const std::string& root() const { return root_; }
  std::string directory_for(int64_t step) const;
  std::string temporary_for(int64_t step) const;
  // Complete checkpoints (with a manifest), newest first.
  std::vector<std::string> complete() const;
  // What LATEST names, if it exists.
  std::optional<std::string> latest() const;

  // Renames the finished `temporary` into place, syncs the directory and points LATEST at it.
  // Rank 0 only.
  void publish(const std::string& temporary, int64_t step) const;
  // Removes complete checkpoints but the one of `step` and the `keep` - 1 highest-step others.
  // Rank 0 only; a failure is a warning.
  void prune(int64_t step, int keep) const;
  // Removes temporary directories that a crashed save left behind.
  void remove_stale_temporaries() const;
  // Creates the root if needed and checks that a checkpoint can be written there, so that a run
  // learns at its start, not at its first save, that it could never save. Rank 0 only.
  void check_writable() const;

 private:
  std::string root_;
};

// Checks that `files` (every file of the manifest when empty) exist with the manifest's size and
// checksum. The Error names the first bad file.
Manifest verify_checkpoint(const std::string& directory,
                           const std::vector<std::string>& files = {});

// A checkpoint directory as given, or in a directory of checkpoints the one LATEST names (else the
// complete one of the highest step). An Error when `path` is neither.
std::string resolve_checkpoint(const std::string& path);

// The checkpoints --resume may continue from, in order of preference, unverified: "none" gives
// none; "auto" the one LATEST names, then the other complete ones from the highest step down;
// anything else is that checkpoint directory alone. Verification is the load's job
// (load_checkpoint), spread over the ranks that read the files.
std::vector<std::string> resume_candidates(const std::string& resume, const CheckpointStore& store);

}  // namespace myriad
