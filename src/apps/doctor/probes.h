#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

class Communicator;
class ProcessContext;

// What this rank runs on.
struct DeviceIdentity {
  std::string device;  // "cpu", or "cuda:0 NVIDIA H100 80GB HBM3"
  std::string uuid;    // the GPU's UUID; empty on the CPU
  std::string driver = "n/a";
  std::string cuda = "n/a";
  std::string nccl = "n/a";
};
DeviceIdentity identify_device(const torch::Device& device);

// Bytes this rank may use: the device's free memory, or on the CPU its share (over the ranks of
// its host) of the host's available memory.
int64_t free_memory(const torch::Device& device, int local_size);

// An all-reduce and an all-gather of about `bytes` on `comm`, timed on this rank over `iters`
// calls after one warm-up (callers take the slowest rank). Zeros on a communicator of one rank.
struct CollectiveRates {
  double all_reduce_seconds = 0.0;  // per call
  double all_reduce_busbw = 0.0;    // bytes per second, as nccl-tests defines it
  double all_gather_busbw = 0.0;
};
CollectiveRates time_collectives(Communicator& comm, int64_t bytes, int iters);

// Seconds of a one-way transfer of `bytes` from `from` to `to` on `comm`, closed by a one-byte
// acknowledgement: the fastest of `iters` after one warm-up, measured by `from` (zero on every
// other rank). Only `from` and `to` take part.
double time_transfer(Communicator& comm, int from, int to, int64_t bytes, int iters);

// A barrier over all ranks that sleeps while it waits, so that ranks idle during another pair's
// measurement leave the CPU to it (tests run several ranks on one core).
void wait_quietly(const ProcessContext& context);

// FLOP/s of the classifier's GEMM (float32 output from `gemm_dtype` operands) at a chunk of
// `rows` classes, `batch` samples and `dim` columns.
double measure_gemm_rate(const torch::Device& device, torch::ScalarType gemm_dtype, int64_t rows,
                         int64_t batch, int64_t dim);

// Read + write bytes per second of a device-to-device copy of `bytes`.
double measure_memory_bandwidth(const torch::Device& device, int64_t bytes);

// Whether every rank sees the same directory at `directory`: rank 0 writes a file of a random
// token there, every rank looks for it (for a few seconds: network file systems may show a new
// file late), and rank 0 removes it. Returns whether this rank saw it. Creating the file is
// checked on every rank (a collective Error names rank 0's failure). A collective call.
bool sees_shared_token(const ProcessContext& context, const std::string& directory);

}  // namespace myriad
