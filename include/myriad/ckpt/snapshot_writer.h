#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "myriad/ckpt/manifest.h"

namespace myriad {

class Hdf5File;

// A tensor bound for a dataset of a checkpoint file. bfloat16 and float16 are stored as float32
// and bool as uint8 (the format's rule); other dtypes as they are, in C order.
struct SnapshotDataset {
  std::string name;
  torch::Tensor tensor;  // any device and layout
};

// One HDF5 file of a checkpoint.
struct SnapshotFile {
  std::string name;  // in the checkpoint directory
  std::vector<SnapshotDataset> datasets;
  // Scalar attributes (and anything else small), written through HDF5 once the datasets exist.
  std::function<void(Hdf5File&)> attributes;
  // The next step changes it in its forward (batch norm's statistics): copied before the other
  // files, and waited for by order_before_forward().
  bool changed_by_forward = false;
};

// What one snapshot did, on this rank.
struct SnapshotOutcome {
  std::map<std::string, FileEntry> files;  // sizes and checksums, for the manifest
  int64_t bytes = 0;
  // How long the device-to-host copies took (CUDA events). The next step's small reads of results
  // (a loss, a flag) queue behind them on the copy engine, so this bounds what they cost training.
  double device_copy_seconds = 0;
  double write_seconds = 0;     // from begin() until the last byte went to the kernel
  double sync_seconds = 0;      // fsync of the files and the directory
  double checksum_seconds = 0;  // CRC-32 of the files (their data's, taken as it was written)
  std::string error;            // empty when every file is durable
};

// Writes a checkpoint's files in the background from a snapshot in host memory.
//
// begin() copies the tensors into host buffers (pinned with CUDA, on a copy stream of its own)
// and returns; threads lay each file out through HDF5 (every dataset contiguous, its space taken
// at creation), then write the buffers straight to their datasets' offsets with large
// page-aligned pwrite() calls, checksumming what they write, and fsync. The buffers are allocated
// once and reused. When they hold less than a snapshot, the copies stream through them: each
// waits for a buffer that a finished write frees (double buffering), so begin() returns only when
// everything is copied.
class SnapshotWriter {
 public:
  // `host_memory_bytes` of buffers; `threads` writers.
  SnapshotWriter(torch::Device device, int64_t host_memory_bytes, int threads = 4);
  ~SnapshotWriter();  // abandons a snapshot in flight: its files stay incomplete
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // The host memory that holds `files` whole.
  static int64_t memory_for(const std::vector<SnapshotFile>& files);
  // The size of one buffer with `host_memory_bytes` in all.
  static int64_t buffer_bytes(int64_t host_memory_bytes);
  // Adds buffers (of the first ones' size) up to `host_memory_bytes` in all. Not while a snapshot
  // is in flight.
  void reserve(int64_t host_memory_bytes);
  int64_t host_memory_bytes() const;

  // Starts writing `files` into `directory` (created if missing), a snapshot of the tensors as
  // the work queued so far leaves them. `step` names it in fault points and errors. One at a time.
  void begin(const std::string& directory, std::vector<SnapshotFile> files, int64_t step);
  // Make the current CUDA stream wait, on the device, for the copies of the files changed by the
  // forward, or of all files: call them before the first kernel that changes what they read.
  // Nothing to do on the CPU (begin() copied), when nothing is in flight, or a second time.
  void order_before_forward();
  void order_before_backward();
  bool in_flight() const;
  // The snapshot in flight has ended: durable, or failed.
  bool done() const;
  // Waits for the snapshot in flight to end.
  SnapshotOutcome wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad
