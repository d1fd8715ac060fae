#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/snapshot_writer.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/training_checkpoint.h"

namespace myriad {

class ProcessContext;

struct CheckpointOptions {
  int keep = 3;       // checkpoints kept
  bool sync = false;  // every save waits until its checkpoint is published
  // Host memory for snapshots, bytes; 0: one whole snapshot (host_memory_for).
  int64_t host_memory = 0;
};

// Checkpoints that training does not wait for (docs/checkpoint-format.md, "Asynchronous saves").
//
// save() snapshots the state into host memory at a step boundary and returns; the SnapshotWriter
// writes, syncs and checksums this rank's files in the background. At each later step boundary
// poll() asks every rank whether its files are durable (one small all-reduce); once all are, rank 0
// writes the manifest and publishes the checkpoint (rename, LATEST; old checkpoints are deleted in
// the background), and a metrics record follows. At most one save is in flight: a save due before
// the last is published waits for it. A save that fails on any rank raises the same Error on every
// rank, and the previous checkpoint stays in use; a crash at any moment leaves it as LATEST.
class AsyncCheckpointer : public StepObserver {
 public:
  // `state` gives the shapes (for the host memory); `record` gets rank 0's metrics record of each
  // published checkpoint.
  AsyncCheckpointer(const ProcessContext& context, CheckpointStore store,
                    const TrainingState& state, CheckpointOptions options,
                    std::function<void(const nlohmann::json&)> record = {});

  // The host memory that holds a snapshot of `state` whole, on this rank.
  static int64_t host_memory_for(const ProcessContext& context, const TrainingState& state);

  // Starts checkpoint `state.step` (collective). With `sync`, returns once it is published.
  void save(const TrainingState& state);
  // Make the device wait for the snapshot's copies before the next step changes what they read:
  // the backbone's (batch norm statistics) before the step starts, the rest before the backward
  // (the classifier's update).
  void step_started(const StepStart&) override { writer_.order_before_forward(); }
  void before_backward(const BeforeBackward&) override { writer_.order_before_backward(); }
  // At each step's end (collective): publishes the save in flight if every rank's files are
  // durable.
  void step_finished(const StepEnd&) override { poll(); }
  void poll();
  // Waits for the save in flight and publishes it (collective).
  void complete();
  bool in_flight() const { return pending_.has_value(); }

 private:
  struct Pending {
    int64_t step = 0;
    Manifest manifest;  // all but the files
    std::string temporary;
    std::chrono::steady_clock::time_point start;
    // Training's wait in save(): for the previous save, and for this one's snapshot.
    double blocked_seconds = 0;
  };
  // What every rank wrote, gathered: the manifest with all files, their bytes, and the slowest
  // rank's blocked and write seconds.
  struct Published {
    Manifest manifest;
    int64_t bytes = 0;
    double blocked = 0, write = 0;
  };
  void publish();
  // Every rank's files, or the first rank's failure raised as `what`'s on every rank.
  Published gather_files(const Pending& p, const SnapshotOutcome& mine,
                         const std::string& what) const;
  // Rank 0: the manifest written and synced, the directory renamed into place, old ones pruned.
  void write_manifest_and_rename(const Pending& p, Manifest& manifest);
  void report_published(const Pending& p, const SnapshotOutcome& mine, const Published& published,
                        double durable) const;

  const ProcessContext& context_;
  CheckpointStore store_;
  CheckpointOptions options_;
  std::function<void(const nlohmann::json&)> record_;
  int64_t memory_limit_;  // of the snapshot buffers
  SnapshotWriter writer_;
  std::optional<Pending> pending_;
  std::future<void> pruning_;  // rank 0's removal of old checkpoints, in the background
  bool warned_overlap_ = false;
  bool said_streaming_ = false;
};

// One checkpoint, written and published before it returns (collective).
void save_checkpoint(const ProcessContext& context, const CheckpointStore& store,
                     const TrainingState& state, int keep);

}  // namespace myriad
