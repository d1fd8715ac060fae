#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "myriad/train/train_config.h"
#include "options.h"

namespace myriad {

class CommFactory;
class Communicator;
class ProcessContext;

// A problem a check found, in one line that names the hosts and the fix. A check that finds none
// passed. Errors fail the preflight; warnings are printed above the verdict.
// A check that could not run says why with kSkipped.
enum class Severity { kWarning, kError, kSkipped };
struct Finding {
  Severity severity = Severity::kError;
  std::string line;
};
using Findings = std::vector<Finding>;

// A link between two neighbouring hosts (indices into Survey::hosts).
struct HostLink {
  int first = 0;
  int second = 0;
  double rate = 0.0;  // bytes per second of its slower direction
};

// What the checks learn, the same on every rank; rank 0 prints it (report.h). The checks fill it
// in the order they run, each reading what those before it filled.
struct Survey {
  // Where every rank runs (a collective call).
  Survey(ProcessContext& context, const TrainConfig& config, const DoctorOptions& options,
         const torch::Device& device, int64_t message);
  ~Survey();
  Survey(const Survey&) = delete;
  Survey& operator=(const Survey&) = delete;

  ProcessContext& context;
  const TrainConfig& config;
  const DoctorOptions& options;
  const torch::Device device;
  const int64_t message;  // bytes of each bandwidth measurement
  std::string placement;
  // Where ranks would share a GPU, the plan's line for each such host (GpuPlan::conflicts): NCCL
  // refuses them, so the checks that need it are skipped.
  std::vector<std::string> shared_gpus;
  std::vector<std::string> host_of_rank;
  std::vector<std::string> hosts;  // each once, in rank order
  std::vector<int> host_index;     // of each rank's host in `hosts`
  std::vector<int> leaders;        // the first rank of each host

  // check_devices, per rank.
  std::vector<std::string> devices;
  std::vector<std::string> uuids;
  std::vector<std::string> versions;  // "driver / CUDA / NCCL"
  // check_interfaces, per rank: the interface NCCL takes, those Open MPI takes.
  std::vector<std::string> nccl_interface;
  std::vector<std::string> mpi_interfaces;
  // check_run_directory: whether each directory is shared.
  std::vector<std::string> directories;
  // check_data.
  int64_t classes = 0;
  // check_compute: this rank's backbone, then the measures of every rank.
  int64_t profile_batch = 0;
  int64_t backbone_params = 0;
  std::vector<double> activation_bytes;  // at --batch-size
  std::vector<double> gemm_rate;
  std::vector<double> memory_rate;
  // check_network. The communicators live as long as the survey, as they would during training,
  // so that the memory check sees the device memory they take.
  std::unique_ptr<CommFactory> comms;
  std::unique_ptr<Communicator> host_comm;
  std::string backend;
  std::vector<int> host_ranks;          // per host
  std::vector<double> host_all_reduce;  // per host, busbw of its slowest rank
  std::vector<double> host_all_gather;
  double world_all_reduce = 0.0;  // among all ranks, busbw of the slowest rank
  double world_all_gather = 0.0;
  double world_latency = 0.0;  // seconds of a small all-reduce on the slowest rank
  std::vector<HostLink> links;
  // check_step: myriad-train's backbone step at --batch-size, on the slowest rank: eager, and
  // replaying CUDA graphs (zero where they cannot run); whether the run takes graphs; per rank
  // the step without the all-reduce's exposed part, and that part.
  double eager_step = 0.0;
  double graphs_step = 0.0;
  bool graphs = false;
  std::vector<double> backbone_seconds;
  double exposed_all_reduce = 0.0;
  // check_memory, per rank: bytes free and bytes the configuration needs.
  std::vector<double> free_memory;
  std::vector<double> needed_memory;
};

// The checks; each is a collective call that every rank makes.
Findings check_devices(Survey& s);        // ranks that share a GPU, versions that differ
Findings check_interfaces(Survey& s);     // the interfaces NCCL and Open MPI take
Findings check_run_directory(Survey& s);  // --run-dir and --checkpoint-dir shared by all hosts
Findings check_data(Survey& s);           // the classes; the data file opens on every host
Findings check_compute(Survey& s);        // the backbone's profile, GEMM and memory rates
Findings check_network(Survey& s);        // bandwidth within hosts, among ranks, between hosts
Findings check_step(Survey& s);           // the backbone's training step, eager and as graphs
Findings check_memory(Survey& s);         // the configuration fits every rank's memory
Findings check_links(Survey& s);          // no host's link is much slower than the others'

// The preflight, in the order the checks run, each under the name its row of the report takes.
struct Check {
  const char* name;
  Findings (*run)(Survey&);
};
inline constexpr Check kChecks[] = {{"devices", check_devices},
                                    {"interfaces", check_interfaces},
                                    {"run directory", check_run_directory},
                                    {"data", check_data},
                                    {"compute", check_compute},
                                    {"network", check_network},
                                    {"training step", check_step},
                                    {"memory", check_memory},
                                    {"links between hosts", check_links}};

// What each check found, in kChecks' order.
struct CheckOutcome {
  const char* name;
  Findings findings;
};

}  // namespace myriad
