#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "myriad/comm/device_selection.h"
#include "myriad/util/error.h"

namespace myriad {

// One per process: owns MPI's lifetime and knows where this rank runs. MPI is the control plane
// (start-up, rank discovery, agreement); tensors travel through a Communicator.
class ProcessContext {
 public:
  // Initialises MPI, asking for MPI_THREAD_SERIALIZED and failing when less is provided.
  ProcessContext(int* argc, char*** argv);
  ~ProcessContext();
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  int thread_level() const { return thread_level_; }
  // MPI_COMM_WORLD with errors returned instead of aborting, so MYRIAD_CHECK_MPI sees them.
  MPI_Comm world() const { return MPI_COMM_WORLD; }

  // The ranks of every host agree which GPU each drives, from what each sees (a collective call).
  GpuPlan plan_gpus() const;
  // Picks and activates this rank's device: kCpu the CPU; kAuto a GPU where every rank has one,
  // else the CPU; kCuda a GPU, or a UsageError. Before anything touches a GPU, ranks that would
  // share one (more ranks on a host than GPUs) are a UsageError whose one line names each such
  // host, its ranks and GPUs, and the ways out: for kAuto too, since quietly training on the CPU
  // would be a hundred times slower (a collective call). A process given the CPU keeps the host
  // memory it frees (keep_freed_host_memory).
  torch::Device select_device(DevicePreference preference);
  // The device `plan` gives this rank under `preference`, activated, without refusing ranks that
  // share a GPU (myriad-doctor reports them as a failed check and goes on).
  torch::Device use_device(DevicePreference preference, const GpuPlan& plan);
  // Whether CUDA devices are visible on every rank (a collective call).
  bool all_ranks_have_gpu() const;

  // Logical AND of `local` over all ranks (a collective call).
  bool all_true(bool local) const;
  // Every rank's string, in rank order (a collective call).
  std::vector<std::string> all_gather_strings(const std::string& local) const;
  // Where every rank runs, for the start-up log: "4 ranks on 2 hosts: a ranks 0-1 on cuda:0-1, b
  // ranks 2-3 on cuda:0-1" (describe_placement of every rank's host and `device`). Collective.
  std::string placement(const torch::Device& device) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int thread_level_ = 0;
  std::string hostname_;
};

// Ranks by host, in order of each host's first rank, with the ranks and devices as ranges:
// hosts[r] and devices[r] ("cpu", "cuda:1") are rank r's.
std::string describe_placement(const std::vector<std::string>& hosts,
                               const std::vector<std::string>& devices);

// Given every rank's error ("" for none), the same on every rank: raises one collective `Raised`
// naming the first failing rank and its error, if any failed.
template <class Raised = Error>
void raise_first_failure(const std::vector<std::string>& errors, const std::string& what) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw Raised(str_format("{} failed on rank {}: {}", what, r, errors[r]),
                   error_location(__FILE__, __LINE__), /*collective=*/true);
    }
  }
}

// Runs `work` on every rank and agrees on the outcome: if it failed on any rank, every rank raises
// one collective `Raised` naming the first failing rank and its error. For work whose failure may
// differ between ranks (a file one node cannot read), so that no rank goes on into a collective
// alone. A collective call.
template <class Raised = Error, class Work>
void on_every_rank(const ProcessContext& context, const std::string& what, Work&& work) {
  std::string error;
  try {
    work();
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = e.what();
  }
  raise_first_failure<Raised>(context.all_gather_strings(error), what);
}

}  // namespace myriad
